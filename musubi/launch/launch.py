"""Launcher side of `musubi train`: validate, lay out the run directory, start torchrun, report.

Workers are always started by torchrun (`torch.distributed.run`), one process
per GPU or N gloo CPU ranks; Musubi never writes its own launcher. Everything
that can be checked before a worker starts is checked here, so a bad job fails
in a second with one line, and an existing run directory is never overwritten.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from musubi.config.batch_plan import rule_line
from musubi.config.job import JobSpec
from musubi.config.load import load_job
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.data.job_version import dataset_env
from musubi.data.pixels import fill_normalization
from musubi.launch import admission
from musubi.launch.multinode import DEFAULT_JOIN_TIMEOUT_S, Rendezvous, make_rendezvous, rendezvous_error
from musubi.store.db import db_path
from musubi.store.rundir import default_run_dir, env_record, read_json, run_record, write_json
from musubi.store.startup import mark

EXIT_OK, EXIT_FAIL, EXIT_CONFIG = 0, 1, 2


@dataclass
class TrainRequest:
    """What `musubi train` was asked."""

    job_path: Path
    nproc: int | None = None
    out: Path | None = None
    resume: bool = False
    max_steps: int | None = None
    overrides: list[str] = field(default_factory=list)
    device: str | None = None  # "cuda" | "cpu" | None (GPUs if any)
    probe_only: bool = False
    check: bool = True  # run the preflight first (`--no-check` skips it, and job.json records that)
    fleet_member: bool = False  # a job of a fleet: RUN/ belongs to the fleet, only RUN/JOB/ is ours
    quiet: bool = False  # rank 0's console output discarded (it is also in logs/rank0.log): drills
    argv: list[str] = field(default_factory=list)
    # Multi-node (contract/rendezvous.py): one `musubi train` per node, the same arguments on each.
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_timeout_s: int = DEFAULT_JOIN_TIMEOUT_S
    iface: str | None = None
    rendezvous: Rendezvous | None = None  # set by prepare()
    deadline_s: float | None = None  # drills: end torchrun (and its workers) after this many seconds
    oversubscribe: bool = False  # more CPU ranks than cores, on purpose
    allow_changes: list[str] = field(default_factory=list)  # --resume: job fields that may differ (train.lr,data)
    say: Callable[[str], None] | None = None  # one line per start-up phase (the console of `musubi train`)
    #: Times of the launcher's own start-up marks (store/startup.py LAUNCHER): `entered` from the CLI (else
    #: launch_train's start), the rest from prepare(); written once the job's folder exists (it must not exist
    #: before `musubi train` makes it).
    marks: dict[str, float] = field(default_factory=dict)


class RunFinished(Exception):
    """`--resume` of a run that already trained to its last step: nothing to launch."""

    def __init__(self, run_dir: Path, job_dir: Path) -> None:
        super().__init__(f"{job_dir}: already finished (job.json: status done); nothing to resume. To train "
                         "again, use another --out")
        self.run_dir, self.job_dir = run_dir, job_dir


class PreflightFailed(Exception):
    """The preflight found a problem: its FAIL lines are the message (exit code 1)."""


@dataclass
class TrainResult:
    """How it went: exit code, where, and the one-line error if any."""

    code: int
    run_dir: Path
    job_dir: Path
    error: str | None = None
    timed_out: bool = False  # ended by TrainRequest.deadline_s
    already_finished: bool = False  # --resume of a finished run: nothing was launched (`error` says so)


def _wait(proc: subprocess.Popen, deadline_s: float | None) -> tuple[int, bool]:
    """torchrun's exit code; past the deadline torchrun and every worker it started are ended (TERM, then KILL)."""
    from musubi.launch.proctree import stop_trees

    try:
        return proc.wait(timeout=deadline_s), False
    except subprocess.TimeoutExpired:
        stop_trees([proc], grace=15)
        return proc.wait(), True


def visible_gpus() -> int:
    """GPUs this process may use (CUDA_VISIBLE_DEVICES applied). torch counts them with NVML without starting
    the CUDA driver in this process (falling back to the driver when NVML fails); `is_available()` would start it
    (cudaGetDeviceCount), which a launcher or a fleet that never runs a kernel itself only waits for. Whether
    CUDA really works is the preflight's question (and the ranks')."""
    import torch

    return torch.cuda.device_count()


def resolve_world(nproc: int | None, device: str | None, oversubscribe: bool = False,
                  placed: bool = False) -> tuple[int, str]:
    """(ranks, device kind): all GPUs by default, else 2 CPU ranks (or fewer cores); never more CPU ranks
    than cores unless `oversubscribe`. `placed`: a fleet's job on the GPUs the fleet gave it (its
    CUDA_VISIBLE_DEVICES, --nproc of them): not counted again, which would import torch and start the CUDA
    driver in this process only to confirm the fleet's own placement."""
    if nproc is not None and nproc < 1:
        raise ConfigError(f"--nproc {nproc}: must be >= 1")
    if placed and device == "cuda" and nproc is not None:
        return nproc, device
    kind = device or ("cuda" if visible_gpus() else "cpu")  # --device cpu: no torch import (fast refusals)
    if kind == "cuda":
        gpus = visible_gpus()
        if gpus == 0:
            raise ConfigError("--device cuda but no GPU is visible; check CUDA_VISIBLE_DEVICES or use --device cpu")
        n = nproc or gpus
        if n > gpus:
            raise ConfigError(
                f"--nproc {n} but only {gpus} GPU(s) are visible: two ranks would share a GPU; "
                f"use --nproc {gpus} or fewer"
            )
        return n, kind
    if kind != "cpu":
        raise ConfigError(f"--device {kind!r}: use cuda or cpu")
    cores = admission.usable_cores()
    if nproc is not None:
        admission.check_cpu_ranks(nproc, cores, oversubscribe)
    return nproc or max(1, min(2, cores)), kind


def _pick_run_dir(req: TrainRequest, name: str) -> Path:
    if req.resume:
        if req.out is not None:
            return req.out
        runs = sorted(Path("runs").glob(f"*-{name}")) if Path("runs").is_dir() else []
        if not runs:
            raise ConfigError(f"--resume: no earlier run of {name!r} under runs/; give --out RUN_DIR")
        return runs[-1]
    if req.out is None:
        return default_run_dir(name)
    return req.out


@dataclass
class Admitted:
    """A job that passed every check made before anything is written (what --dry-run prints)."""

    spec: JobSpec
    nproc: int
    kind: str
    run_dir: Path
    job_dir: Path
    before: dict  # the job.json a resume continues ({} for a new run)
    changes: list[dict]  # --resume: the fields that differ from `before` (allowed by --allow-changes)


def _say(req: TrainRequest, line: str) -> None:
    if req.say is not None:
        req.say(line)


def _admit_resume(req: TrainRequest, spec) -> tuple[Path, Path, dict, list[dict]]:
    """--resume, before torch is imported: the run exists, holds this model, and the job changed only where
    --allow-changes says; RunFinished when it already trained to its last step."""
    run_dir = _pick_run_dir(req, spec.name)
    job_dir = run_dir / spec.name
    if not job_dir.is_dir():
        raise ConfigError(f"--resume: {job_dir} does not exist; nothing to resume (run without --resume)")
    job_json = job_dir / RUN_FILES.job
    try:
        record = read_json(job_json) if job_json.is_file() else {}
    except (OSError, ValueError):
        raise ConfigError(f"--resume: {job_json} is not readable JSON; use another --out") from None
    old = record.get("config") if isinstance(record, dict) else None
    if not isinstance(old, dict):
        return run_dir, job_dir, {}, []
    if (old.get("task"), old.get("model")) != (spec.task, spec.model):
        raise ConfigError(
            f"--resume: {job_dir} holds {old.get('task')}/{old.get('model')}, the job file asks for "
            f"{spec.task}/{spec.model}; use the same job or another --out"
        )
    # Every node runs this with the same arguments, so all agree (a node reading the record node 0 already
    # rewrote sees no change and status running). A fleet member's changes were announced by
    # `musubi run --resume`, whose policy is that they resume as changed.
    allowed = None if req.fleet_member else admission.parse_allowed(req.allow_changes)
    changes = admission.check_resume(record, spec.resolved(), allowed, job_json)
    if admission.finished(record) and not changes:
        raise RunFinished(run_dir, job_dir)
    return run_dir, job_dir, record, changes


def admit(req: TrainRequest) -> Admitted:
    """Every check that needs no preflight and writes nothing: config, resume, world size, task, batch."""
    spec = load_job(req.job_path, req.overrides)  # before torch: a config error is reported at once
    # Single-channel frames: their statistics enter the resolved config first, so a resume compares like with like.
    store = (req.out.resolve().parent if req.out is not None else Path("runs").resolve()) / "musubi.db"
    fill_normalization(spec.data, store)
    before: dict = {}
    changes: list[dict] = []
    if req.resume:
        run_dir, job_dir, before, changes = _admit_resume(req, spec)
    nproc, kind = resolve_world(req.nproc, req.device, req.oversubscribe or req.fleet_member, req.fleet_member)
    req.rendezvous = make_rendezvous(req.nnodes, req.node_rank, req.rdzv_endpoint, req.out, spec.name,
                                     req.rdzv_id, req.iface, req.rdzv_timeout_s)
    if spec.train.pin_cpus and os.environ.get("MUSUBI_CPUS"):
        from musubi.launch.pin_plan import check_cpus_value

        check_cpus_value(os.environ["MUSUBI_CPUS"], nproc)  # a bad core list fails before anything is written
    from musubi.store.tracking import check_tracking

    if not req.fleet_member:
        from musubi.tasks.registry import build_task

        # A fleet checked every job this way before it started any (fleet/run.py validate_fleet); here it would
        # only import torch and torchvision again (2.4-2.7 s of a job's 2.8-s launcher in `make demo` on this
        # project's 2-core machine, 2026-11-27). The ranks still run the task's checks before they build the model.
        build_task(spec).validate()
    check_tracking(spec.tracking)
    if spec.train.global_batch is not None:
        from musubi.config.batch_plan import plan_batch

        plan_batch(spec, nproc)  # the workers' own rule: refuse a non-dividing world size before launch
    if not req.resume:
        run_dir = _pick_run_dir(req, spec.name)
        job_dir = run_dir / spec.name
    return Admitted(spec, nproc, kind, run_dir, job_dir, before, changes)


def dry_run_plan(req: TrainRequest) -> list[str]:
    """`musubi train --dry-run`: validate the job as a launch would and return the plan; start and write nothing."""
    try:
        a = admit(req)
    except RunFinished as done:
        return [str(done)]
    lines = admission.plan_lines(a.spec, a.nproc, a.kind, a.run_dir, req.resume)
    lines += [f"resume: {c['key']} {c['before']!r} -> {c['after']!r} (--allow-changes)" for c in a.changes]
    if req.check:
        lines.append("preflight: runs at launch (`musubi check` runs it alone)")
    return lines


def _has_checkpoint(job_dir: Path) -> bool:
    """Whether a resume has a committed checkpoint to continue from. Asked on --resume only: the reader
    imports DCP (~0.8 s on top of torch on this 2-core machine, 2026-11-26), which a new run skips."""
    from musubi.checkpoint.checkpoint import latest_checkpoint

    return latest_checkpoint(job_dir / "checkpoints") is not None


def prepare(req: TrainRequest) -> tuple[Path, Path, dict, int, str]:
    """Validate everything checkable before launch; lay out RUN/ and RUN/JOB/job.json."""
    a = admit(req)
    req.marks["admitted"] = time.time()
    spec, nproc, kind, run_dir, job_dir = a.spec, a.nproc, a.kind, a.run_dir, a.job_dir
    rdzv = req.rendezvous
    if rdzv is not None:
        # The preflight's environment check judges the variables for this many nodes.
        os.environ["MUSUBI_NNODES"] = str(rdzv.nnodes)
    if rdzv is not None and not rdzv.is_first:
        # Another node's agent: node 0 owns the records (shared storage, one writer); our workers start only
        # once every agent joined the rendezvous, so node 0 has written job.json by then.
        if req.resume and not _has_checkpoint(job_dir):
            raise ConfigError(f"--resume: no committed checkpoint in {job_dir / 'checkpoints'}; run without --resume")
        if req.check:
            run_preflight(req, spec, nproc, kind)
        (job_dir / "logs").mkdir(parents=True, exist_ok=True)
        return run_dir, job_dir, {"config": spec.resolved(), "attempts": 0}, nproc, kind
    if req.resume:
        if not _has_checkpoint(job_dir):
            raise ConfigError(
                f"--resume: no committed checkpoint in {job_dir / 'checkpoints'}; run without --resume"
            )
        attempts = int(a.before.get("attempts", 0)) + 1
    else:
        taken = job_dir.exists() and any(p.name != "logs" for p in job_dir.iterdir())
        if taken or (not req.fleet_member and (run_dir / RUN_FILES.run).exists()):
            raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
        attempts = 1
    rule = rule_line(spec, nproc)
    if rule is not None:  # the first line: an LR other than the one written must be seen (config/job.py lr_rule)
        _say(req, rule)
    if req.check:  # last: it takes seconds, and every refusal above is cheaper
        _say(req, "preflight: machine, disk and data checks...")
    preflight = run_preflight(req, spec, nproc, kind) if req.check else None
    job_dir.mkdir(parents=True, exist_ok=True)
    if preflight is not None:
        write_json(run_dir / RUN_FILES.preflight, preflight.to_dict())
    config = spec.resolved()
    if not req.fleet_member:
        if not req.resume or not (run_dir / RUN_FILES.run).exists():
            write_json(run_dir / RUN_FILES.run, run_record({"jobs": [config]}, req.argv))
        write_json(run_dir / RUN_FILES.env, {**env_record(), **dataset_env([config], db_path(run_dir))})
    record = {"config": config, "status": "running", "attempts": attempts, "nproc": nproc, "device": kind,
              "resume": req.resume, "nnodes": rdzv.nnodes if rdzv else 1,
              "preflight": "skipped (--no-check)" if preflight is None else
              ("passed with warnings" if preflight.warnings else "passed")}
    prev = job_dir / RUN_FILES.job
    if prev.is_file():
        record["history"] = read_json(prev).get("history", [])
    # What a resume changed, and when: job.json's config is the newest, this says what it replaced.
    changes = list(a.before.get("changes", [])) + [{"attempt": attempts, **c} for c in a.changes]
    if changes:
        record["changes"] = changes
    write_json(job_dir / RUN_FILES.job, record)
    req.marks["prepared"] = time.time()
    return run_dir, job_dir, record, nproc, kind


def _checkpoint_bytes(spec) -> int | None:
    """One checkpoint's size from the parameter count of the model built on the meta device."""
    import torch

    from musubi.preflight import checkpoint_bytes_estimate
    from musubi.tasks.registry import build_task

    try:
        with torch.device("meta"):
            params = sum(p.numel() for p in build_task(spec).build_model().parameters())
    except Exception:  # noqa: BLE001 - a model that cannot be built on meta: the disk check guesses
        return None
    slots = 2 if spec.train.optimizer == "adamw" else 1
    return checkpoint_bytes_estimate(params, optimizer_slots=slots)


def run_preflight(req: TrainRequest, spec, nproc: int, kind: str):
    """The preflight of `musubi check`, for this job's GPUs, data and output; raise PreflightFailed on a FAIL."""
    from rich.console import Console

    from musubi.preflight import data_targets, render, run_checks

    out = req.out or Path("runs")
    ckpt = _checkpoint_bytes(spec) if spec.checkpoint.enabled else 0
    # On CPU ranks the gloo all-reduce test tells little (loopback) and costs seconds: GPU runs only.
    report = run_checks(None if kind == "cuda" else [], data_targets(spec.data), out, ckpt or None,
                        comm=kind == "cuda", keep_checkpoints=spec.checkpoint.keep_last, cpu_ranks=nproc)
    if report.failed or report.warnings:
        from musubi.preflight.result import PreflightReport

        # Only what needs attention; the full report goes to RUN/preflight.json.
        shown = PreflightReport(report.failed + report.warnings, report.seconds)
        render(shown, Console(stderr=True, soft_wrap=True))
    if report.failed:
        lines = "; ".join(f"{r.check}: {r.found} -> {r.fix}" for r in report.failed)
        raise PreflightFailed(f"preflight failed ({lines}); fix it or pass --no-check")
    return report


def torchrun_argv(job_dir: Path, nproc: int, resume: bool, stop_at_step: int | None, max_restarts: int = 0,
                  probe_only: bool = False, extra: list[str] | None = None,
                  rdzv: Rendezvous | None = None) -> list[str]:
    """The torchrun command line of one job: single-node (its own free port on loopback) or one node's agent.

    `--max-restarts`: when a rank fails (an OOM, a crash), torchrun stops the others and
    restarts all of them (on every node); the workers resume from the newest committed checkpoint.
    """
    from musubi.contract.rendezvous import torchrun_module

    # torchrun behind a rendezvous bound to the endpoint's address (127.0.0.1 for `--standalone`), never to
    # every interface.
    where = rdzv.torchrun_args() if rdzv is not None else ["--standalone", "--nnodes=1"]
    argv = [sys.executable, *torchrun_module(), *where, f"--nproc-per-node={nproc}",
            # torchrun's own default: a rank's exit (done, OOM, crash) is acted on within 0.1 s, not 0.5 s.
            f"--max-restarts={max_restarts}", "--monitor-interval=0.1",
            # torchrun's own files (per-attempt error records) stay in the run, not in $TMPDIR.
            f"--log-dir={job_dir / 'logs' / 'torchelastic'}",
            *(extra or []), "-m", "musubi.worker.worker", str(job_dir)]
    if probe_only:
        argv.append("--probe-only")
    if resume:
        argv.append("--resume")
    if stop_at_step is not None:
        argv += ["--stop-at-step", str(stop_at_step)]
    return argv


def worker_env(kind: str, nproc: int, deterministic: bool, job_dir: Path | None = None) -> dict[str, str]:
    """Environment of the workers: device kind, thread counts, determinism switches, hang diagnostics."""
    env = dict(os.environ)
    if job_dir is not None:
        from musubi.preflight import diagnostic_env

        # Flight recorder + dump on timeout into the job's logs, unless the user set them.
        env.update(diagnostic_env(job_dir, env))
    env["MUSUBI_DEVICE"] = kind
    env["PYTHONUNBUFFERED"] = "1"
    from musubi.contract.rendezvous import single_node_env

    env.update(single_node_env(env))  # one node: the ranks' gloo/NCCL sockets listen on loopback only
    # Split the cores between ranks instead of letting each rank spawn one thread per core.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    if deterministic:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
    return env


def _tee_stderr(stream, log_path: Path) -> threading.Thread:
    """Copy torchrun's stderr to a file (secret values scrubbed); only our workers' one-line errors reach the console."""
    from musubi.store.redact import scrub_text, secret_values

    secrets = secret_values()

    def pump() -> None:
        with open(log_path, "a", encoding="utf-8") as f:
            for line in stream:
                f.write(scrub_text(line, secrets))
                f.flush()

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    return th


def first_error(job_dir: Path) -> tuple[str | None, str | None]:
    """(kind, message) of the lowest rank that recorded an error."""
    logs = job_dir / "logs"
    files = sorted(logs.glob("error-rank*.txt"), key=lambda p: int(p.stem.removeprefix("error-rank"))) \
        if logs.is_dir() else []
    for p in files:
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
            return rec.get("kind"), f"rank {p.stem.removeprefix('error-rank')}: {rec.get('message')}"
        except ValueError:
            continue
    return None, None


def _term_as_interrupt():  # noqa: ANN202 - the previous handler, or None off the main thread
    def raise_interrupt(signum: int, frame: object) -> None:  # noqa: ARG001
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:  # not the main thread
        return None


def _victim(err: str | None) -> bool:
    """Whether an error is a rank's report that it lost a peer (not the failure's cause)."""
    from musubi.recovery.goodput import is_victim_error

    return is_victim_error(err)


def launch_train(req: TrainRequest) -> TrainResult:
    """Run one job under torchrun to completion; never raises for worker failures."""
    req.marks.setdefault("entered", time.time())
    try:
        run_dir, job_dir, record, nproc, kind = prepare(req)
    except RunFinished as done:  # reported from job.json alone: no torchrun, no torch
        return TrainResult(EXIT_OK, done.run_dir, done.job_dir, error=str(done), already_finished=True)
    rdzv = req.rendezvous
    follower = rdzv is not None and not rdzv.is_first
    logs = job_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in ([] if follower else logs.glob("error-rank*.txt")):
        old.unlink()
    spec_det = bool(record["config"]["train"]["deterministic"])
    restarts = 0 if req.probe_only else int(record["config"]["train"]["max_restarts"])
    from musubi.launch.pin_plan import apply_to_env, plan_pinning

    env = worker_env(kind, nproc, spec_det, job_dir)
    # A lone single-node job reads the topology the env.json it just wrote holds (one reading of the machine).
    from musubi.topology.read import env_topology

    topo = env_topology(run_dir / RUN_FILES.env) if kind == "cuda" and rdzv is None and not req.fleet_member else None
    pins = plan_pinning(bool(record["config"]["train"].get("pin_cpus", True)), kind, nproc, env, topo)
    env = apply_to_env(pins, env)
    node = f"-node{rdzv.node_rank}" if rdzv is not None else ""
    if rdzv is not None:  # several nodes: the workers' sockets on the chosen interface, not loopback
        env.update(rdzv.socket_env(os.environ))
    (logs / f"pinning{node}.txt").write_text(pins.note + "\n", encoding="utf-8")
    argv = torchrun_argv(job_dir, nproc, req.resume, req.max_steps, restarts, req.probe_only, pins.torchrun_args,
                         rdzv)
    started = time.time()
    if rdzv is None or rdzv.node_rank == 0:
        for name, when in req.marks.items():
            mark(job_dir, name, when)
        mark(job_dir, "launcher", started)
    where = f" on node {rdzv.node_rank} of {rdzv.nnodes}" if rdzv is not None else ""
    _say(req, f"launching {nproc} {'GPU' if kind == 'cuda' else 'CPU'} rank{'s' if nproc > 1 else ''}{where} "
         f"(torchrun); each imports torch and joins the process group...")
    old_term = _term_as_interrupt()  # SIGTERM (e.g. from `musubi run`) stops torchrun like Ctrl-C does
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, errors="replace",
                            stdout=subprocess.PIPE if req.probe_only else (subprocess.DEVNULL if req.quiet else None),
                            start_new_session=req.deadline_s is not None)  # its own group: the deadline ends all
    probe_out = None
    if req.probe_only:
        assert proc.stdout is not None
        probe_out = proc.stdout.read()
    pump = _tee_stderr(proc.stderr, logs / f"torchrun{node}.log")
    timed_out = interrupted = False
    try:
        code, timed_out = _wait(proc, req.deadline_s)
    except KeyboardInterrupt:
        interrupted = True
        proc.terminate()
        code = proc.wait()
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    from musubi.checkpoint.daemons import reap_checkpoint_daemons

    reap_checkpoint_daemons(job_dir)  # checkpoint processes of ranks that died (they hold our pipes)
    pump.join(timeout=5)
    err_kind, err = first_error(job_dir)
    if code == 0:
        status, result_code = "done", EXIT_OK
    else:
        status = "failed"
        result_code = EXIT_CONFIG if err_kind == "config" else EXIT_FAIL
        if rdzv is not None and err is None:
            err = rendezvous_error(rdzv, logs / f"torchrun{node}.log")
        if timed_out:
            err = f"did not finish within {req.deadline_s:.0f} s (deadline): torchrun and its workers were ended"
        if interrupted:
            status, err = "interrupted", "interrupted (Ctrl-C or SIGTERM): torchrun and its ranks were stopped"
        if err is None:
            err = f"torchrun exited with {code}; see {logs / f'torchrun{node}.log'}"
    if follower:  # node 0 records the job's outcome
        if interrupted:
            raise KeyboardInterrupt
        return TrainResult(result_code, run_dir, job_dir, err, timed_out)
    summary_path = job_dir / RUN_FILES.summary
    if code == 0 and summary_path.is_file():
        summary = read_json(summary_path)
        if not summary.get("finished"):
            status = "stopped"
    history = record.get("history", [])
    entry: dict = {"attempt": record["attempts"], "exit_code": code, "status": status, "error": err,
                   "started": round(started, 3), "ended": round(time.time(), 3)}
    if status == "done" and summary_path.is_file():
        early = read_json(summary_path).get("early_stop")
        if early and early.get("stopped_step") is not None:  # train.early_stop ended it: where, and why
            entry["early_stop"] = early
    # torchrun restarts of this launch: one progress file per attempt (a failed launch writes no summary).
    attempts_here = list((job_dir / "progress").glob(f"a{record['attempts']}.*.jsonl")) \
        if (job_dir / "progress").is_dir() else []
    if attempts_here:
        entry["restarts"] = len(attempts_here) - 1
    elif summary_path.is_file():
        entry["restarts"] = read_json(summary_path).get("restarts", 0)
    oom_records = sorted((job_dir / "memory").glob("applied-oom-*.json")) if (job_dir / "memory").is_dir() else []
    if oom_records:
        entry["oom_recoveries"] = [read_json(p) for p in oom_records]
    history.append(entry)
    record.update(status=status, history=history)
    write_json(job_dir / RUN_FILES.job, record)
    if not req.probe_only:
        from musubi.recovery.goodput import write_goodput

        good = write_goodput(job_dir)  # reads the history just written
        if good is not None:
            # Each failure's cause (hang with its rank, OOM, the rank that died first) for the fleet.
            mine = [f for f in good["failures"] if f["attempt"].startswith(f"{record['attempts']}.")]
            entry["failures"] = [{k: f[k] for k in ("attempt", "cause", "ranks", "lost_steps", "detail", "site",
                                                    "repeat_of") if k in f} for f in mine]
            entry["goodput"] = good["goodput"]
            if code != 0 and not timed_out and mine and mine[-1]["resumed_from_step"] is None \
                    and mine[-1]["cause"] != "unknown" and (err_kind is None or _victim(err)):
                # The rank that died or hung, not the peer that saw its connection drop.
                from musubi.recovery.goodput import failure_summary

                err = f"attempt {mine[-1]['attempt']} failed: {failure_summary(mine[-1])}"
                entry["error"] = err
            defect = good.get("defect")
            if defect and str(defect["attempts"][-1]).startswith(f"{record['attempts']}."):
                # The same cause struck again after a restart: the launch failed of a defect (recovery/repeats.py).
                from musubi.recovery.repeats import defect_line

                entry["defect"] = defect_line(job_dir.name, defect)
                if code != 0 and not timed_out:
                    err = entry["error"] = entry["defect"]
            write_json(job_dir / RUN_FILES.job, record)
    if interrupted:  # recorded above; the caller decides (musubi train exits 130, a drill stops)
        raise KeyboardInterrupt
    if probe_out:
        print(probe_out.strip().splitlines()[-1] if probe_out.strip() else "", flush=True)
    return TrainResult(result_code, run_dir, job_dir, err, timed_out)
