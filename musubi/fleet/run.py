"""`musubi run FLEET.yaml`: validate everything, check the machine, pack and train, then rank and ship.

The flow: load and validate the fleet (every task job's model and data, every
command's program), refuse what can never fit, run the preflight once, lay out
the run directory, run the jobs (local executor), then build the leaderboard,
export the top-k to ONNX and register them with a deployment manifest.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from musubi.config.fleet import CommandJob, FleetSpec, TaskJob
from musubi.config.load import load_fleet
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.contract.spare_client import process_created
from musubi.data.job_version import dataset_env
from musubi.fleet.jobs import check_command
from musubi.fleet.machine import SHOW, check_topology, device_unit
from musubi.fleet.stop import FleetInterrupted, check_unlocked, run_lock
from musubi.store.db import db_path
from musubi.store.rundir import default_run_dir, env_record, read_json, run_record, write_json
from musubi.store.startup import chain
from musubi.topology.cores import usable_cores

if TYPE_CHECKING:  # the executor imports torch: a refused fleet never waits for it
    from musubi.fleet.local import JobState

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
    dry_run: bool = False  # print the placement plan; start and write nothing
    gpus: int | None = None  # --dry-run on a machine of this many GPUs (not this one)
    replay: Path | None = None  # --dry-run --replay RUN: simulate RUN/fleet.json's measured attempts
    #: What started the fleet (`musubi data watch`: {"data_dir", "version"}), recorded in env.json.
    trigger: dict[str, str] | None = None
    #: The fleet's own start-up, wall-clock marks in the order passed (FLEET_STARTUP): fleet.json and fleet.log.
    marks: dict[str, float] = field(default_factory=dict)


#: The fleet's own start-up before its first job: (component, the mark that ends it). `process` is the
#: interpreter's start (/proc), `entered` the CLI command's first line, `imported` the fleet's modules (torch
#: among them), `checked` every job's checks (validate_fleet), `machine` the GPU count (NVML), a recorded
#: topology's check and the refusals,
#: `recorded` run.json and env.json (NVML, nvidia-smi's topology), `planned` the local executor built (durations
#: from the history, the topology env.json holds, each GPU's cores); the first plan and the first job's spawn
#: follow (fleet.json's attempt history). bench/fleet.py measured seconds from spawning `musubi run` to its
#: first job's spawn, unexplained until these marks (BENCHMARKS.md, start-up).
FLEET_STARTUP: tuple[tuple[str, str], ...] = (
    ("python + CLI import", "entered"),
    ("fleet imports (torch)", "imported"),
    ("job checks", "checked"),
    ("GPU count, refusals", "machine"),
    ("run records", "recorded"),
    ("executor set-up (history, topology)", "planned"),
)


def startup_parts(marks: dict[str, float]) -> dict[str, float]:
    """Seconds of each FLEET_STARTUP component whose marks are present (store/startup.chain: from the previous
    mark present, the first from the interpreter's start `process`), and "in all". Without `process` the parts
    count from the first mark present."""
    out: dict[str, float] = {}
    start, parts = marks.get("process"), FLEET_STARTUP
    if start is None:
        first = next((i for i, (_, to) in enumerate(parts) if to in marks), None)
        if first is None:
            return out
        start, parts = marks[parts[first][1]], parts[first + 1:]
    last = chain(marks, start, parts, out)
    if "process" in marks:
        out["in all"] = round(last - start, 3)
    return out


def _mark(req: FleetRequest, name: str) -> None:
    req.marks.setdefault(name, time.time())


def job_problem(job: TaskJob | CommandJob, base: Path, torch_checks: bool) -> str | None:
    """One job's first problem, named with the job, or None. Without `torch_checks` only the launcher's cheap
    checks run (model name table, data paths, train split against a batch per rank: no torch)."""
    from musubi.launch.checks import fleet_job_checks
    from musubi.store.tracking import check_tracking

    try:
        if not isinstance(job, TaskJob):
            check_command(job, base)
        elif not torch_checks:
            fleet_job_checks(job.spec, min(job.widths))
        else:
            from musubi.launch.checks import check_task_metrics
            from musubi.tasks.registry import build_task  # torch: after every job's cheap checks

            task = build_task(job.spec)
            task.validate()
            check_task_metrics(job.spec, task)
            check_tracking(job.spec.tracking)
    except ConfigError as e:
        msg = str(e)
        return msg if msg.startswith(f"job {job.name!r}") else f"job {job.name!r}: {msg}"
    return None


def validate_fleet(spec: FleetSpec, base: Path) -> None:
    """Every job checked before anything starts (model names, data, commands); every job's problem reported at
    once. The cheap checks of all jobs run first: torch is imported only for jobs that passed them."""
    problems: dict[str, str] = {}
    for job in spec.jobs:
        problem = job_problem(job, base, torch_checks=False)
        if problem is not None:
            problems[job.name] = problem
    # Jobs alike but for their names pass torch's checks alike (a task built and its model run on the meta device:
    # ~0.3 s a job on a CPU; the seed fleet's 38 task jobs are 2 configs): a passed config is not checked again. A
    # problem is found again for each job that has it, so that its message names that job.
    passed: set[str] = set()
    for job in spec.jobs:
        if job.name not in problems and isinstance(job, TaskJob):
            alike = json.dumps({k: v for k, v in job.spec.resolved().items() if k != "name"}, sort_keys=True)
            if alike in passed:
                continue
            problem = job_problem(job, base, torch_checks=True)
            if problem is not None:
                problems[job.name] = problem
            else:
                passed.add(alike)
    if problems:
        ordered = [problems[j.name] for j in spec.jobs if j.name in problems]
        raise ConfigError("\n".join(ordered))


def machine(req: FleetRequest) -> tuple[list[int], str]:
    """(devices, kind): the visible GPUs, or CPU rank slots (default 2) when there is none."""
    from musubi.topology.visible import visible_gpus

    gpus = visible_gpus()
    kind = req.device or ("cuda" if gpus else "cpu")
    if kind == "cuda":
        if not gpus:
            raise ConfigError("--device cuda but no GPU is visible; check CUDA_VISIBLE_DEVICES or use --device cpu")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [int(x) for x in visible.split(",")] if visible and all(x.strip().isdigit() for x in
                                                                         visible.split(",")) else list(range(gpus))
        return ids[:gpus], kind
    slots = req.cpu_slots or max(1, min(2, usable_cores()))
    return list(range(slots)), "cpu"


def recorded_executor(run_dir: Path) -> str | None:
    """The executor an earlier `musubi run` used for this run directory (None when unknown).

    Here, not beside the executors: reading it imports no torch, so a `--resume` refused at once (a live run
    holds the folder, another executor asked) costs ~1 s of CPU instead of ~6."""
    try:
        return json.loads((run_dir / RUN_FILES.fleet).read_text(encoding="utf-8")).get("executor", "local")
    except (OSError, ValueError):
        return None


def run_fleet(req: FleetRequest, console: Console | None = None) -> tuple[Path, dict[str, JobState]]:
    """Run a fleet to the end; returns the run directory and every job's final state."""
    console = console or Console()
    _mark(req, "imported")
    req.marks.setdefault("process", process_created())  # this process's start, to a clock tick (contract)
    earlier = None
    if req.resume and req.out is not None:
        earlier = recorded_executor(req.out)
    executor = req.executor or earlier or "local"
    if executor not in ("local", "slurm"):
        raise ConfigError(f"--executor {executor}: use local (this machine) or slurm")
    if earlier and executor != earlier:
        raise ConfigError(f"--resume: {req.out} ran with --executor {earlier}; resume it with the same executor")
    spec = load_fleet(req.fleet_path)
    base = req.fleet_path.resolve().parent
    validate_fleet(spec, base)
    _mark(req, "checked")
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
        # A typo or a file of another machine is refused before anything is written (a re-run must work).
        check_topology(spec, base, devices)
    problems = refusals(spec, devices, kind) if executor == "local" else []
    if problems:  # before the preflight and before any file is written
        raise ConfigError(problems[0])
    _mark(req, "machine")
    if req.resume:
        if req.out is None or not (req.out / RUN_FILES.fleet).is_file():
            raise ConfigError("--resume: give --out RUN_DIR of an earlier `musubi run` (it holds fleet.json)")
        run_dir = req.out
        check_unlocked(run_dir)  # a live `musubi run` on this folder: refuse before the preflight
        for line in changed_jobs(_resolved(spec), run_dir):
            console.print(f"warning: {line}", highlight=False, markup=False)
    else:
        run_dir = req.out or default_run_dir(spec.name)
        if run_dir.exists() and any(p.name != ".lock" for p in run_dir.iterdir()):
            raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    if req.check and executor == "local":  # on Slurm the jobs run elsewhere: this machine tells nothing
        _preflight(spec, kind, run_dir, console)
    try:
        with run_lock(run_dir):  # one `musubi run` per run folder at a time
            return _run_locked(req, spec, base, executor, devices, kind, run_dir, console)
    except FleetInterrupted as e:
        e.run_dir = run_dir
        raise


def _resolved(spec: FleetSpec) -> dict:
    """The fleet as RUN/run.json records it (every task job's spec resolved)."""
    return {"name": spec.name, "leaderboard": spec.leaderboard.model_dump(), "success": spec.success.model_dump(),
            "jobs": [({"spec": j.spec.resolved(), **j.model_dump(exclude={"spec"})} if isinstance(j, TaskJob)
                      else j.model_dump()) for j in spec.jobs]}


def changed_jobs(resolved: dict, run_dir: Path) -> list[str]:
    """--resume: one line per job whose definition differs from the one RUN/run.json recorded."""

    from musubi.store.redact import redact_tree

    try:
        recorded = read_json(run_dir / RUN_FILES.run)["config"]["jobs"]
        states = read_json(run_dir / RUN_FILES.fleet).get("jobs", {})
        before = {(j["spec"]["name"] if "spec" in j else j["name"]): j for j in recorded}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return []
    lines = []
    for job in resolved["jobs"]:
        name = job["spec"]["name"] if "spec" in job else job["name"]
        now = json.loads(json.dumps(redact_tree(job), default=str))
        if name not in before:
            lines.append(f"job {name!r} is new since {run_dir}/run.json: it runs now")
        elif now != before[name]:
            if (states.get(name) or {}).get("state") == "done":
                lines.append(f"job {name!r} changed since it finished in {run_dir}: --resume keeps its "
                             "result as it is; use a new --out to train the changed job")
            else:
                lines.append(f"job {name!r} changed since {run_dir}/run.json was written: it resumes with the "
                             "new definition (run.json keeps the first)")
    return lines


def refusals(spec: FleetSpec, devices: list[int], kind: str, gpu_memory: float | None = None) -> list[str]:
    """One line per job that can never run on this machine (GPU count, declared memory), naming job and field."""
    unit = "GPUs" if kind == "cuda" else "CPU slots (--cpu-slots)"
    out = []
    for i, job in enumerate(spec.jobs):
        if job.gpus > len(devices):
            out.append(f"jobs[{i}] ({job.name}): gpus: {job.gpus} > the {len(devices)} {unit} of this machine; "
                       "lower its gpus:")
    if kind == "cuda" and any(j.memory_gib for j in spec.jobs):
        gpu_memory = gpu_memory if gpu_memory is not None else gpu_memory_gib(devices)
    if gpu_memory is not None:
        for i, job in enumerate(spec.jobs):
            if job.memory_gib and job.memory_gib > gpu_memory:
                out.append(f"jobs[{i}] ({job.name}): memory_gib: {job.memory_gib:g} > the {gpu_memory:.1f} GiB of "
                           "one GPU here; lower it, or a smaller batch/model")
    return out


def gpu_memory_gib(devices: list[int]) -> float | None:
    """The smallest total memory of `devices` in GiB (NVML; never initialises CUDA here); None if unknown."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return min(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(d)).total
                       for d in devices) / 2**30
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML: the declaration cannot be checked here
        return None


def _run_locked(req: FleetRequest, spec: FleetSpec, base: Path, executor: str, devices: list[int], kind: str,
                run_dir: Path, console: Console) -> tuple[Path, dict[str, JobState]]:
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = _resolved(spec)
    if not req.resume:
        write_json(run_dir / RUN_FILES.run, run_record(resolved, sys.argv))
    env = {**env_record(), **dataset_env([j.spec.resolved() for j in spec.jobs if isinstance(j, TaskJob)],
                                         db_path(run_dir))}
    if req.trigger:
        env["trigger"] = req.trigger
    write_json(run_dir / RUN_FILES.env, env)
    _mark(req, "recorded")
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
    with fleet_logging(run_dir, console):
        if spec.success.baseline_steps:
            from musubi.fleet.baseline import measure_baselines

            measure_baselines(spec, run_dir, devices, kind, read_json(run_dir / RUN_FILES.env), console)
        from musubi.fleet.local import LocalFleet

        fleet = LocalFleet(spec, run_dir, base, devices, kind, req.resume, console,
                           gpu_memory=gpu_memory_gib(devices) if kind == "cuda" else None)
        _mark(req, "planned")
        fleet.startup = startup_parts(req.marks)
        log.info("fleet start-up: %s s in all (%s)", fleet.startup.get("in all", "?"),
                 ", ".join(f"{k} {v:.1f}" for k, v in fleet.startup.items() if k != "in all"))
        topo = fleet.packer.topology
        if topo is None:
            log.info("placement without a topology: the lowest free %ss", device_unit(kind), extra=SHOW)
        else:
            log.info("placing by topology: %s", topo.summary(), extra=SHOW)
            missing = [d for d in devices if d not in topo.gpu_indices]
            if missing:
                log.warning("the topology does not name device(s) %s: jobs that get them are placed without it "
                            "(lowest free %ss)", ",".join(map(str, missing)), device_unit(kind))
        states = fleet.run()
    _finish(spec, run_dir, console)
    return run_dir, states


class _ConsoleLines(logging.Handler):
    """The fleet's decisions on the console, one concise line each: placements and pinning (records logged with
    extra=SHOW), and warnings. Everything else goes to RUN/fleet.log only."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.INFO)
        self.console = console

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or bool(getattr(record, "show", False))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            prefix = "fleet: " if record.levelno < logging.WARNING else f"fleet {record.levelname.lower()}: "
            self.console.print(prefix + record.getMessage(), highlight=False, markup=False, soft_wrap=True)
        except Exception:  # noqa: BLE001 - logging never breaks the fleet
            self.handleError(record)


@contextmanager
def fleet_logging(run_dir: Path, console: Console) -> Iterator[None]:
    """While the fleet runs: its log records (musubi.fleet: every placement and its reason, the core plan,
    starts, ends, failures) go to RUN/fleet.log, and the decisions also to the console."""
    logger = logging.getLogger("musubi.fleet")
    run_dir.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(run_dir / RUN_FILES.fleet_log, encoding="utf-8")
    to_file.setLevel(logging.INFO)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    to_console = _ConsoleLines(console)
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(to_file)
    logger.addHandler(to_console)
    try:
        yield
    finally:
        logger.removeHandler(to_console)
        logger.removeHandler(to_file)
        to_file.close()
        logger.setLevel(level)


def plan_fleet(req: FleetRequest, console: Console | None = None) -> list[str]:
    """`musubi run --dry-run`: each job's predicted duration, the plan (order, GPU counts, placements and
    reasons, core plan) the local executor would follow, the predicted makespan and a per-GPU timeline, on
    this machine, the recorded `machine.topology`, or `--gpus N` GPUs; nothing is started or written. The
    timeline drives the fleet's own packer on a virtual clock with the predicted durations. Returns the lines."""
    console = console or Console()
    spec = load_fleet(req.fleet_path)
    base = req.fleet_path.resolve().parent
    if req.replay is not None:
        return _replay(spec, req, console)
    validate_fleet(spec, base)
    # the planner's models and the packer (torch, through the executor): once every job passed its checks
    from musubi.fleet.durations import demand_of, machine_of
    from musubi.fleet.local import estimates
    from musubi.fleet.machine import cpus_value, describe_cpus, device_cores
    from musubi.fleet.moldable import advance, best_plan, lower_bound, makespan, simulate
    from musubi.fleet.packer import Demand, Packer, order, unplaceable
    from musubi.fleet.sharing import share_note, share_policy
    from musubi.fleet.timeline import busy_fraction, text_timeline
    from musubi.topology.read import read_node_topology

    wide = [j for j in spec.jobs if j.nodes > 1]
    if wide or (req.executor or "local") != "local":
        raise ConfigError("--dry-run shows the local executor's placements on one machine; drop --executor slurm "
                          "and multi-node jobs")
    if req.gpus is not None:
        devices, kind = list(range(req.gpus)), "cuda"  # a machine of N GPUs: no history of it is known here
        db, here = None, []
    else:
        devices, kind = machine(req)
        db, here = db_path(req.out or default_run_dir(spec.name)), machine_of(env_record())
    topo = check_topology(spec, base, devices)
    if topo is None and kind == "cuda" and req.gpus is None:
        topo = read_node_topology()
    est = estimates(spec, len(devices), db, here, kind)
    queue = [demand_of(j, est[j.name]) for j in spec.jobs]
    problems = refusals(spec, devices, kind) or unplaceable(queue, len(devices))
    if problems:
        raise ConfigError(problems[0])
    unit = device_unit(kind)
    lines = [f"fleet {spec.name}: {len(spec.jobs)} jobs on {len(devices)} {unit}s (dry run: nothing started)",
             f"topology: {topo.summary() if topo is not None else 'none: the lowest free ' + unit + 's'}"]
    cores = device_cores(devices, topo, kind) if spec.machine.pin_cpus and req.gpus is None else None
    if cores is not None:
        lines.append(f"cores per {unit}: {cores.reason}" if cores else f"no CPU pinning: {cores.reason}")
    lines.append("predicted durations (start-up included; see README 'How long each job takes'):")
    for j in spec.jobs:
        e = est[j.name]
        each = ", ".join(f"{w} {unit}{'s' if w > 1 else ''} {t:.0f} s" for w, t in zip(e.widths, e.seconds, strict=True))
        measured = (f"; alone on one GPU: utilisation {e.util:.2f}, peak {e.peak_gib:.1f} GiB"
                    if e.util is not None and e.peak_gib is not None else "")
        lines.append(f"  {j.name}: {each} ({e.source}; start-up {e.startup_s:.0f} s, comm {e.comm:g}{measured})")
    clock = [0.0]
    # --gpus N plans a machine that is not this one: no history of it, so nothing is measured to share.
    share = share_policy(spec.machine.share_gpus, kind, gpu_memory_gib(devices) if kind == "cuda" and
                         req.gpus is None else None)
    packer = Packer(list(devices), list(queue), topology=topo, planner=best_plan, clock=lambda: clock[0],
                    share=share, unit=unit)

    first_plan = None

    def placed(d: Demand, gpus: list[int]) -> None:
        nonlocal first_plan
        first_plan = first_plan or packer.plan
        pin = cpus_value(cores, gpus) if cores else None
        t = d.predicted(len(gpus)) or 0.0
        lines.append(f"at {clock[0]:.0f} s: {d.name} on {unit} {','.join(map(str, gpus))} "
                     f"(predicted {t:.0f} s): {packer.reasons[d.name]}" + (f"; {describe_cpus(pin)}" if pin
                                                                                  else ""))

    bars = advance(packer, clock, {}, placed)
    lines += [f"never starts: {d.name} (waits for {', '.join(d.after)})" for d in packer.queue]
    declared = makespan(simulate(devices, order(list(queue)), {d.name: d.gpus for d in queue}))
    span = makespan(bars)
    how = first_plan.how if first_plan is not None else "declared"
    lines.append(f"predicted makespan {span:.0f} s ({how}; the declared widths and order: {declared:.0f} s; "
                 f"no schedule beats {lower_bound(queue, len(devices)):.0f} s); {unit}s busy "
                 f"{busy_fraction(bars, devices):.0%}")
    # The two baselines of bench/fleet.py, from the same predictions: (a) every job alone on its fewest
    # devices, one after another; (b) one after another, each on as many devices as it may use.
    alone = sum(d.predicted(min(d.allowed())) or 0.0 for d in queue)
    widest = sum(d.predicted(max(w for w in d.allowed() if w <= len(devices))) or 0.0 for d in queue)
    if span > 0:
        lines.append(f"one job at a time: (a) alone on one {unit} {alone:.0f} s -> {alone / span:.2f}x "
                     f"({alone / span / len(devices):.2f} x {len(devices)} {unit}s); (b) each on all it may use "
                     f"{widest:.0f} s -> {widest / span:.2f}x")
    widths = {b.name: len(b.gpus) for b in bars}
    changed = [f"{d.name} {d.gpus}->{widths[d.name]}" for d in queue if d.name in widths and widths[d.name] != d.gpus]
    if changed:
        lines.append("widths chosen (moldable jobs): " + ", ".join(changed))
    guests = sorted(n for n, r in packer.reasons.items() if r.startswith("shares GPU"))
    if guests:
        lines.append(f"GPU sharing (machine.share_gpus: auto): {', '.join(guests)} join a GPU another job holds; "
                     f"without sharing the plan predicts {first_plan.unshared:.0f} s" if first_plan is not None
                     and first_plan.share else f"GPU sharing: {', '.join(guests)} join a GPU another job holds")
    elif share is not None:
        lines.append(share_note(queue, share))
    lines += text_timeline(bars, devices, unit)
    for ln in lines:
        console.print(ln, highlight=False, markup=False, soft_wrap=True)
    return lines


def _replay(spec: FleetSpec, req: FleetRequest, console: Console) -> list[str]:
    """`--dry-run --replay RUN`: RUN/fleet.json's measured attempts through the fleet's packer (fleet/replay.py)."""
    from musubi.fleet.replay import replay, replay_lines
    from musubi.fleet.timeline import text_timeline

    assert req.replay is not None
    path = req.replay / RUN_FILES.fleet if req.replay.is_dir() else req.replay
    try:
        record = read_json(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--replay {req.replay}: no readable fleet.json ({e}); give the run directory of a "
                          "`musubi run`") from None
    if record.get("fleet") != spec.name:
        raise ConfigError(f"--replay {req.replay}: it is a run of fleet {record.get('fleet')!r}, not {spec.name!r}; "
                          "give that fleet's file")
    r = replay(record, spec, list(range(req.gpus)) if req.gpus else None)
    if not r.recorded:
        raise ConfigError(f"--replay {req.replay}: fleet.json records no finished attempt")
    # --gpus N simulates GPUs; else the recorded devices (fleet.json's `device`; older records ran on GPUs)
    unit = "GPU" if req.gpus else device_unit(str(record.get("device", "cuda")))
    lines = replay_lines(r, unit) + ["recorded:", *text_timeline(r.recorded, r.devices, unit), "simulated:",
                                     *text_timeline(r.simulated, r.devices, unit)]
    for ln in lines:
        console.print(ln, highlight=False, markup=False, soft_wrap=True)
    return lines


def _preflight(spec: FleetSpec, kind: str, run_dir: Path, console: Console) -> None:
    from musubi.launch.request import PreflightFailed
    from musubi.preflight import data_targets, render, run_checks
    from musubi.preflight.result import PreflightReport

    targets = [t for j in spec.jobs if isinstance(j, TaskJob) for t in data_targets(j.spec.data)]
    report = run_checks(None if kind == "cuda" else [], list(dict.fromkeys(targets)), run_dir.parent, None,
                        comm=kind == "cuda")
    if report.failed or report.warnings:
        render(PreflightReport(report.failed + report.warnings, report.seconds), Console(stderr=True))
    if report.failed:
        lines = "; ".join(f"{r.check}: {r.found} -> {r.fix}" for r in report.failed)
        raise PreflightFailed(f"preflight failed ({lines}); fix it or pass --no-check")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / RUN_FILES.preflight, report.to_dict())


def note_finish(run_dir: Path, **figures: Any) -> None:
    """Add the fleet's end-phase figures to fleet.json (ship_s, exported_early; the CLI's checklist_s and
    checked_at): bench/fleet.py splits the time after the last job by them."""
    state = run_dir / RUN_FILES.fleet
    if state.is_file():
        write_json(state, {**read_json(state), **figures})


def _finish(spec: FleetSpec, run_dir: Path, console: Console) -> None:
    """Leaderboard, export of the top-k and registration (jobs that ended well only)."""
    from musubi.fleet.ship import ship

    t0 = time.perf_counter()
    early: list[str] = []
    try:
        early = ship(spec, run_dir, console).early
    except ConfigError as e:  # the jobs' results stand; say what could not be shipped
        log.warning("leaderboard/export/registry: %s", e)
        console.print(f"leaderboard/export/registry: {e}", highlight=False, markup=False)
    seconds = round(time.perf_counter() - t0, 2)
    # The fleet's end phase after its last job, in fleet.json (bench/fleet.py's overhead) and fleet.log, with
    # the top-k whose early export ship() registered as it was.
    note_finish(run_dir, ship_s=seconds, exported_early=early)
    with fleet_logging(run_dir, console):
        log.info("shipped in %.1f s%s", seconds, f" (export done early for: {', '.join(early)})" if early else "",
                 extra=SHOW)

