"""`musubi run FLEET.yaml`: validate everything, check the machine, pack and train, then rank and ship.

The flow: load and validate the fleet (every task job's model and data, every
command's program), refuse what can never fit, run the preflight once, lay out
the run directory, run the jobs (local executor), then build the leaderboard,
export the top-k to ONNX and register them with a deployment manifest.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from musubi.config.errors import ConfigError
from musubi.config.fleet import FleetSpec, TaskJob
from musubi.config.load import load_fleet
from musubi.evaluate.provenance import dataset_env
from musubi.fleet.jobs import check_command
from musubi.fleet.local import JobState, LocalFleet
from musubi.store.db import db_path
from musubi.store.rundir import default_run_dir, env_record, read_json, run_record, write_json

log = logging.getLogger("musubi.fleet")


@dataclass
class FleetRequest:
    """What `musubi run` was asked."""

    fleet_path: Path
    out: Path | None = None
    resume: bool = False
    executor: str | None = None  # local | slurm; None: local, or on --resume the one fleet.json names
    cpu_slots: int | None = None
    check: bool = True
    device: str | None = None
    #: What started the fleet (`musubi data watch`: {"data_dir", "version"}), recorded in env.json.
    trigger: dict[str, str] | None = None


def validate_fleet(spec: FleetSpec, base: Path) -> None:
    """Every job checked before anything starts: model names, data, commands."""
    from musubi.runtime.tracking import check_tracking
    from musubi.tasks.registry import build_task

    for job in spec.jobs:
        try:
            if isinstance(job, TaskJob):
                build_task(job.spec).validate()
                check_tracking(job.spec.tracking)
            else:
                check_command(job, base)
        except ConfigError as e:
            msg = str(e)
            raise ConfigError(msg if msg.startswith(f"job {job.name!r}") else f"job {job.name!r}: {msg}") from None


def machine(req: FleetRequest) -> tuple[list[int], str]:
    """(devices, kind): the visible GPUs, or CPU rank slots (default 2) when there is none."""
    from musubi.runtime.launch import visible_gpus

    gpus = visible_gpus()
    kind = req.device or ("cuda" if gpus else "cpu")
    if kind == "cuda":
        if not gpus:
            raise ConfigError("--device cuda but no GPU is visible; check CUDA_VISIBLE_DEVICES or use --device cpu")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [int(x) for x in visible.split(",")] if visible and all(x.strip().isdigit() for x in
                                                                         visible.split(",")) else list(range(gpus))
        return ids[:gpus], kind
    slots = req.cpu_slots or max(1, min(2, os.cpu_count() or 1))
    return list(range(slots)), "cpu"


def run_fleet(req: FleetRequest, console: Console | None = None) -> tuple[Path, dict[str, JobState]]:
    """Run a fleet to the end; returns the run directory and every job's final state."""
    console = console or Console()
    from musubi.fleet.slurm import recorded_executor

    earlier = recorded_executor(req.out) if req.resume and req.out is not None else None
    executor = req.executor or earlier or "local"
    if executor not in ("local", "slurm"):
        raise ConfigError(f"--executor {executor}: use local (this machine) or slurm")
    if earlier and executor != earlier:
        raise ConfigError(f"--resume: {req.out} ran with --executor {earlier}; resume it with the same executor")
    spec = load_fleet(req.fleet_path)
    base = req.fleet_path.resolve().parent
    validate_fleet(spec, base)
    if executor == "slurm":
        from musubi.fleet.slurm import check_slurm, cluster_kind

        check_slurm()
        if spec.success.baseline_steps:
            raise ConfigError("success.baseline_steps times single-GPU baselines on this machine; drop it for "
                              "--executor slurm")
        devices, kind = [], req.device or cluster_kind()
    else:
        wide = [j for j in spec.jobs if j.nodes > 1]
        if wide:
            raise ConfigError(f"job {wide[0].name!r} asks for nodes: {wide[0].nodes}; the local executor has one "
                              "machine: use --executor slurm (or run `musubi train --nnodes` on each node)")
        devices, kind = machine(req)
    if req.resume:
        if req.out is None or not (req.out / "fleet.json").is_file():
            raise ConfigError("--resume: give --out RUN_DIR of an earlier `musubi run` (it holds fleet.json)")
        run_dir = req.out
    else:
        run_dir = req.out or default_run_dir(spec.name)
        if run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    if req.check and executor == "local":  # on Slurm the jobs run elsewhere: this machine tells nothing
        _preflight(spec, kind, run_dir, console)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = {"name": spec.name, "leaderboard": spec.leaderboard.model_dump(),
                "jobs": [({"spec": j.spec.resolved(), **j.model_dump(exclude={"spec"})} if isinstance(j, TaskJob)
                          else j.model_dump()) for j in spec.jobs]}
    if not req.resume:
        write_json(run_dir / "run.json", run_record(resolved, sys.argv))
    env = {**env_record(), **dataset_env([j.spec.resolved() for j in spec.jobs if isinstance(j, TaskJob)],
                                         db_path(run_dir))}
    if req.trigger:
        env["trigger"] = req.trigger
    write_json(run_dir / "env.json", env)
    if executor == "slurm":
        from musubi.fleet.slurm import SlurmFleet

        console.print(f"fleet {spec.name}: {len(spec.jobs)} jobs on Slurm ({'GPU' if kind == 'cuda' else 'CPU'} "
                      f"jobs) -> {run_dir}", highlight=False, markup=False)
        states = SlurmFleet(spec, run_dir, base, kind, req.resume, console).run()
        _finish(spec, run_dir, console)
        return run_dir, states
    console.print(f"fleet {spec.name}: {len(spec.jobs)} jobs on {len(devices)} "
                  f"{'GPU' if kind == 'cuda' else 'CPU slot'}{'s' if len(devices) > 1 else ''} -> {run_dir}",
                  highlight=False, markup=False)
    if spec.success.baseline_steps:
        from musubi.fleet.baseline import measure_baselines

        measure_baselines(spec, run_dir, devices, kind, read_json(run_dir / "env.json"), console)
    states = LocalFleet(spec, run_dir, base, devices, kind, req.resume, console).run()
    _finish(spec, run_dir, console)
    return run_dir, states


def _preflight(spec: FleetSpec, kind: str, run_dir: Path, console: Console) -> None:
    from musubi.preflight import data_targets, render, run_checks
    from musubi.preflight.result import PreflightReport
    from musubi.runtime.launch import PreflightFailed

    targets = [t for j in spec.jobs if isinstance(j, TaskJob) for t in data_targets(j.spec.data)]
    report = run_checks(None if kind == "cuda" else [], list(dict.fromkeys(targets)), run_dir.parent, None,
                        comm=kind == "cuda")
    if report.failed or report.warnings:
        render(PreflightReport(report.failed + report.warnings, report.seconds), Console(stderr=True))
    if report.failed:
        lines = "; ".join(f"{r.check}: {r.found} -> {r.fix}" for r in report.failed)
        raise PreflightFailed(f"preflight failed ({lines}); fix it or pass --no-check")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "preflight.json", report.to_dict())


def _finish(spec: FleetSpec, run_dir: Path, console: Console) -> None:
    """Leaderboard, export of the top-k and registration (jobs that ended well only)."""
    from musubi.fleet.ship import ship

    try:
        ship(spec, run_dir, console)
    except ConfigError as e:  # the jobs' results stand; say what could not be shipped
        log.warning("leaderboard/export/registry: %s", e)
        console.print(f"leaderboard/export/registry: {e}", highlight=False, markup=False)

