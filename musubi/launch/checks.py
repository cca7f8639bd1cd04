"""The launch's checks: one ordered list that `musubi train` runs before it writes anything, and that
`musubi train --dry-run` runs in full (then stops).

Cheap checks come first and import no torch: the job file, the model name (a generated table), the data's
folders, the run folder, the ranks against the GPUs or cores, the batch against the train split, a resumed
run's checkpoint (its marker). A job refused by any of them is refused in well under a second, before a
byte is written. Then the checks that need torch: the task's own checks (the model built on the meta
device), the metrics keep_best and early_stop watch against those the task's validation reports, a changed
resume's model against the checkpoint's signature, and last the machine's preflight (seconds; every refusal
above is cheaper).

What those need of torch is read in one go (launch/task_checks.py, a TaskReadings): by a child of the launch's
warm spare when `admit` was given one to start (`musubi train`: the launcher then never imports torch), else in
this process. The checks judge the readings the same way either way, with the same lines.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from musubi.checkpoint.committed import latest_checkpoint
from musubi.config.batch_plan import plan_batch, rule_line
from musubi.config.job import JobSpec
from musubi.config.load import load_job
from musubi.contract.env import MUSUBI_CPUS, MUSUBI_NNODES
from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_OK
from musubi.contract.run_files import RUN_FILES
from musubi.data.presence import check_paths, check_train_size
from musubi.launch import admission
from musubi.launch.multinode import make_rendezvous
from musubi.launch.ranks import resolve_world
from musubi.launch.request import PreflightFailed, RunFinished, TrainRequest
from musubi.store.rundir import default_run_dir, read_json

if TYPE_CHECKING:  # the types only: tasks import torch
    from musubi.launch.spare import WarmSpare
    from musubi.tasks.base import Task
from musubi.contract.records import TaskQuery, TaskReadings
from musubi.launch.task_checks import ANSWER_NAME, QUERY_NAME, asks_anything, read_task
from musubi.tasks.model_check import check_model


@dataclass
class Admitted:
    """A job as the checks found it: what --dry-run prints and what the launch starts."""

    req: TrainRequest
    spec: JobSpec = None  # type: ignore[assignment]  # set by the first check
    nproc: int = 0
    kind: str = ""
    run_dir: Path = Path()
    job_dir: Path = Path()
    before: dict = field(default_factory=dict)  # the job.json a resume continues ({} for a new run)
    changes: list[dict] = field(default_factory=list)  # --resume: fields that differ from `before` (allowed)
    from_start: bool = False  # --resume of a run stopped before its first checkpoint: step 0 in the same folder
    preflight: object | None = None  # the preflight's report (PreflightReport), None when skipped
    spare: WarmSpare | None = None  # the launch's warm spare, started once the cheap checks passed (admit's `start`)
    read: TaskReadings | None = field(default=None, repr=False)  # see `readings`

    def readings(self) -> TaskReadings:
        """What the checks that need torch read of the job's task, read once for all of them (task_query): by a
        child of the warm spare when there is one, else here; ConfigError when the task's own checks refuse."""
        if self.read is None:
            query = task_query(self)
            self.read = readings_of(query, self.spare) if asks_anything(query) else {}
        if "error" in self.read:
            raise ConfigError(self.read["error"])
        return self.read

    @property
    def follower(self) -> bool:
        """Another node's agent of a multi-node job: node 0 owns the run folder and its records."""
        rdzv = self.req.rendezvous
        return rdzv is not None and not rdzv.is_first


def say(req: TrainRequest, line: str) -> None:
    """One start-up line on the console of `musubi train` (nothing for a dry run, a probe or a drill)."""
    if req.say is not None:
        req.say(line)


def task_query(a: Admitted) -> TaskQuery:
    """What this launch's checks need of torch: the task's checks and metrics (not a fleet's job: the fleet made
    them), a changed --resume's model signature (when its checkpoint recorded one), the preflight's parameter count
    and stack (unless --no-check)."""
    req, spec = a.req, a.spec
    signature = False
    if req.resume and a.changes:
        found = latest_checkpoint(a.job_dir / RUN_FILES.checkpoints, warn=False)
        signature = found is not None and found.marker.get("signature") is not None
    return TaskQuery(config=spec.resolved(), validate=not req.fleet_member, metrics=not req.fleet_member,
                     signature=signature, params=req.check and spec.checkpoint.enabled, stack=req.check)


def readings_of(query: TaskQuery, spare: WarmSpare | None) -> TaskReadings:
    """The readings from a child of `spare`; read here when there is none, it cannot serve, or its child met an
    unexpected exception (read again here, so it is raised as it always was)."""
    if spare is not None:
        from musubi.launch.spare import TASK_CHECKS_MODULE, run_in_spare

        asked, answer = spare.folder / QUERY_NAME, spare.folder / ANSWER_NAME
        asked.write_text(json.dumps(query), encoding="utf-8")
        if run_in_spare(spare, TASK_CHECKS_MODULE, [str(asked), str(answer)]) == EXIT_OK and answer.is_file():
            read: TaskReadings = json.loads(answer.read_text(encoding="utf-8"))
            if "crashed" not in read:
                return read
    return read_task(query)


def check_job_file(a: Admitted) -> None:
    """The job file parses and validates, `--set` overrides included."""
    a.spec = load_job(a.req.job_path, a.req.overrides)


def check_model_name(a: Admitted) -> None:
    """The task builds this model (generated name table, no torch)."""
    check_model(a.spec.task, a.spec.model)


def check_data_paths(a: Admitted) -> None:
    """Every on-disk split's folder or file is there."""
    check_paths(a.spec.task, a.spec.data)


def check_normalization(a: Admitted) -> None:
    """Single-channel frames: their statistics enter the resolved config first, so a resume compares like with
    like (computed once per dataset version, kept in musubi.db)."""
    from musubi.data.pixels import fill_normalization

    req = a.req
    store = (req.out.resolve().parent if req.out is not None else Path("runs").resolve()) / "musubi.db"
    fill_normalization(a.spec.data, store)


def check_ranks(a: Admitted) -> None:
    """--nproc against the visible GPUs, or CPU ranks against the cores (counted without torch)."""
    req = a.req
    a.nproc, a.kind = resolve_world(req.nproc, req.device, req.oversubscribe or req.fleet_member, req.fleet_member)


def check_rendezvous(a: Admitted) -> None:
    """Multi-node arguments: endpoint, node rank, interface."""
    req = a.req
    req.rendezvous = make_rendezvous(req.nnodes, req.node_rank, req.rdzv_endpoint, req.out, a.spec.name,
                                     req.rdzv_id, req.iface, req.rdzv_timeout_s)


def pick_run_dir(req: TrainRequest, name: str) -> Path:
    """The run folder: --out, else a new runs/<time>-<name> (a resume: the newest run of this job)."""
    if req.resume:
        if req.out is not None:
            return req.out
        runs = sorted(Path("runs").glob(f"*-{name}")) if Path("runs").is_dir() else []
        if not runs:
            raise ConfigError(f"--resume: no earlier run of {name!r} under runs/; give --out RUN_DIR")
        return runs[-1]
    return req.out if req.out is not None else default_run_dir(name)


def writable_folder(path: Path) -> None:
    """ConfigError unless `path` exists as a folder this process can write into, or can be made in one that
    holds storage (not /proc, /sys: 0 bytes in all)."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--out {path}: {probe} is a file, not a folder; choose another --out")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {path}: {probe} is not writable by this user; choose another --out")
    fs = os.statvfs(probe)
    if fs.f_blocks == 0:
        raise ConfigError(f"--out {path}: {probe} is on a filesystem without storage (0 bytes in all, like /proc); "
                          "choose another --out")


def check_run_folder(a: Admitted) -> None:
    """A new run never writes into an earlier one; a resume continues the run it names (same model, changes only
    where --allow-changes says); the folder can be written."""
    req = a.req
    a.run_dir = pick_run_dir(req, a.spec.name)
    a.job_dir = a.run_dir / a.spec.name
    if req.resume:
        a.before, a.changes = _admit_resume(a)
    elif not a.follower:  # another node's agent finds the folder node 0 made
        job_dir, run_dir = a.job_dir, a.run_dir
        taken = job_dir.is_dir() and any(p.name != RUN_FILES.logs for p in job_dir.iterdir())
        if taken or (not req.fleet_member and (run_dir / RUN_FILES.run).exists()):
            raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    writable_folder(a.job_dir)


def _admit_resume(a: Admitted) -> tuple[dict, list[dict]]:
    """--resume, before torch is imported: the run exists, holds this model, and the job changed only where
    --allow-changes says; RunFinished when it already trained to its last step."""
    req, spec, job_dir = a.req, a.spec, a.job_dir
    if not job_dir.is_dir():
        raise ConfigError(f"--resume: {job_dir} does not exist; nothing to resume (run without --resume)")
    job_json = job_dir / RUN_FILES.job
    try:
        record = read_json(job_json) if job_json.is_file() else {}
    except (OSError, ValueError):
        raise ConfigError(f"--resume: {job_json} is not readable JSON; use another --out") from None
    old = record.get("config") if isinstance(record, dict) else None
    if not isinstance(old, dict):
        return {}, []
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
        raise RunFinished(a.run_dir, job_dir)
    return record, changes


def check_core_list(a: Admitted) -> None:
    """MUSUBI_CPUS (pinned runs): one core set per rank, no core given twice."""
    if a.spec.train.pin_cpus and os.environ.get(MUSUBI_CPUS):
        from musubi.launch.pin_plan import check_cpus_value

        check_cpus_value(os.environ[MUSUBI_CPUS], a.nproc)


def batch_per_rank(spec: JobSpec, ranks: int) -> int | None:
    """Samples per rank and micro-step (ConfigError when a global batch does not divide); None for `auto`."""
    t = spec.train
    if t.batch == "auto" and t.global_batch is None:
        return None  # probed on every rank at start
    return plan_batch(spec, ranks).per_rank


def fleet_job_checks(spec: JobSpec, ranks: int) -> None:
    """A fleet job's cheap checks (no torch), as `musubi train` runs them: model name, data paths, one batch per
    rank of the train split at `ranks` (the job's narrowest width)."""
    check_model(spec.task, spec.model)
    check_paths(spec.task, spec.data)
    per_rank = batch_per_rank(spec, ranks)
    if per_rank is not None:
        check_train_size(spec, per_rank, ranks)


def check_batch(a: Admitted) -> None:
    """The ranks' own batch rule: a global batch divides by the world; every rank gets one full batch of the
    train split (the loader drops a partial one)."""
    per_rank = batch_per_rank(a.spec, a.nproc)
    if per_rank is not None:
        check_train_size(a.spec, per_rank, a.nproc * a.req.nnodes)


def check_tracking_backend(a: Admitted) -> None:
    """An experiment tracker asked for is installed."""
    from musubi.store.tracking import check_tracking

    check_tracking(a.spec.tracking)


def check_resume_checkpoint(a: Admitted) -> None:
    """--resume: the committed checkpoint to continue from (markers and sizes, no torch; the ranks check the
    checksums of the one they load); none (a run stopped before its first save, e.g. preempted) starts from step 0
    in the same folder, keeping what the earlier attempts left (logs, job.json's history), instead of refusing
    both --resume and the folder."""
    if not a.req.resume:
        return
    found = latest_checkpoint(a.job_dir / RUN_FILES.checkpoints)
    if found is not None:  # the world it was written by, before torchrun starts ranks of another
        check_resume_world(found.path, found.marker, a.nproc * a.req.nnodes, a.req.nnodes)
    else:
        a.from_start = True
        say(a.req, f"resume: no committed checkpoint in {a.job_dir / RUN_FILES.checkpoints}: starting from step 0 in "
                   "this folder (the earlier attempts' logs are kept)")


def check_resume_world(path: Path, marker: dict, ranks: int, nnodes: int) -> None:
    """An exact resume needs the world size the checkpoint was written by (its marker's world_size)."""
    # The ranks check it again (checkpoint.load_checkpoint): a torchrun elastic restart can change the world
    # after this launcher's check.
    written = int(marker.get("world_size", ranks))
    if written != ranks:
        use = f"--nproc {written}" if nnodes == 1 else f"--nproc and --nnodes that make {written} ranks"
        raise ConfigError(f"{path}: written by {written} ranks, this run has {ranks}; exact resume needs the same "
                          f"world size: use {use}")


def check_resume_model(a: Admitted) -> None:
    """--resume with changes to the job: the model they build (on the meta device) is the one the checkpoint holds
    (the signature of its parameter names and shapes, recorded in the marker)."""
    if not (a.req.resume and a.changes):
        return  # an unchanged job builds the model that wrote the checkpoint (the ranks check it again)
    found = latest_checkpoint(a.job_dir / RUN_FILES.checkpoints, warn=False)
    if found is None or found.marker.get("signature") is None:
        return
    signature = a.readings().get("signature")
    if signature is None:  # a model that cannot be built on meta: the ranks compare the signature
        return
    # The ranks compare it again (checkpoint.load_checkpoint): they build the model for real.
    if signature != found.marker["signature"]:
        raise ConfigError(f"{found.path}: checkpoint is of another model (signature {found.marker['signature']} != "
                          f"{signature}); resume with the job that wrote it or start a new run directory")


def check_metric_names(a: Admitted) -> None:
    """checkpoint.best_metric (keep_best) and train.early_stop.metric name a metric the task's validation reports.
    A fleet checked every job this way before it started any (fleet/run.py job_problem): not again here."""
    if a.req.fleet_member:
        return
    read = a.readings()
    check_metric_list(a.spec, read.get("metric_names"), str(read.get("primary_metric")))


def check_task_metrics(spec: JobSpec, task: Task) -> None:
    """ConfigError when the job watches a metric `task` declares it never reports (Task.metric_names; a task that
    declares none is checked by the ranks at the first validation)."""
    check_metric_list(spec, task.metric_names(), task.primary_metric)


def check_metric_list(spec: JobSpec, names: Collection[str] | None, primary_metric: str) -> None:
    """ConfigError when the job watches a metric outside `names`, those the task declares its validation reports
    (None: it declares none); `primary_metric` is what keep_best and early_stop watch when the job names none."""
    if names is None:
        return
    # The ranks check again at each validation (saver.check_metric, trainer.watch_patience): a task's declaration
    # could miss a key its metric adds.
    reported = ", ".join(sorted(names))
    ck, early = spec.checkpoint, spec.train.early_stop
    best = ck.best_metric or primary_metric
    if ck.enabled and ck.keep_best > 0 and best not in names:
        raise ConfigError(f"checkpoint.best_metric {best!r} is not a validation metric of this task (it reports "
                          f"{reported}); fix it or set keep_best: 0")
    watched = (early.metric or primary_metric) if early is not None else None
    if watched is not None and watched not in names:
        raise ConfigError(f"train.early_stop.metric {watched!r} is not a validation metric of this task (it reports "
                          f"{reported}); fix it")


def check_task(a: Admitted) -> None:
    """The task's own checks (torch): model arguments and input size on the meta device, files it reads, weights.
    A fleet checked every job this way before it started any (fleet/run.py validate_fleet): not again here."""
    if a.req.fleet_member:
        return
    a.readings()  # the task's own checks ran with the readings; a refusal is raised here


def check_machine(a: Admitted) -> None:
    """The preflight of `musubi check` for this job's GPUs, data and output (skipped by --no-check). First the
    LR rule's line: every refusal of the job itself is behind us, and an LR other than the one written must be
    the first thing seen (config/job.py lr_rule)."""
    rule = rule_line(a.spec, a.nproc)
    if rule is not None:
        say(a.req, rule)
    if not a.req.check:
        return
    if a.req.rendezvous is not None:
        # The preflight's environment check judges the variables for this many nodes.
        os.environ[MUSUBI_NNODES] = str(a.req.rendezvous.nnodes)
    say(a.req, "preflight: machine, disk and data checks...")
    read = a.readings()
    a.preflight = run_preflight(a.spec, a.nproc, a.kind, a.req.out, params=read.get("params"),
                                torch_read=read.get("stack"))


@dataclass(frozen=True)
class Check:
    """One check of the launch: a name for the dry run's line, and the function (ConfigError to refuse)."""

    name: str
    run: Callable[[Admitted], None]
    torch: bool = False  # imports torch (runs after every check that does not)


#: The launch's checks in order; `musubi train` and `musubi train --dry-run` both run exactly these (admit).
CHECKS: tuple[Check, ...] = (
    Check("job file", check_job_file),
    Check("model name", check_model_name),
    Check("data paths", check_data_paths),
    Check("data statistics", check_normalization),
    Check("rendezvous", check_rendezvous),
    Check("run folder", check_run_folder),
    Check("ranks", check_ranks),
    Check("core list", check_core_list),
    Check("batch", check_batch),
    Check("tracking", check_tracking_backend),
    Check("resume checkpoint", check_resume_checkpoint),
    Check("task", check_task, torch=True),
    Check("validation metrics", check_metric_names, torch=True),
    Check("resume model", check_resume_model, torch=True),
    Check("preflight", check_machine, torch=True),
)


def admit(req: TrainRequest, start: Callable[[Admitted], WarmSpare | None] | None = None) -> Admitted:
    """Run every check of the launch in order; the first refusal raises (ConfigError, PreflightFailed,
    RunFinished) and nothing has been written. `start`: called once every check without torch passed, to start the
    launch's warm spare (kept in `Admitted.spare`, stopped again if a later check refuses), unless this process
    has torch already."""
    a = Admitted(req)
    # A launcher that imported torch already (the API in a notebook, the suite's in-process CLI) reads the task as
    # cheaply itself, and starts no process for a job these checks may still refuse.
    if "torch" in sys.modules:
        start = None
    try:
        for check in CHECKS:
            if check.torch and start is not None:
                a.spare, start = start(a), None
            check.run(a)
    except BaseException:
        if a.spare is not None:
            from musubi.launch.spare import stop_spare

            stop_spare(a.spare)
        raise
    return a


def dry_run_plan(req: TrainRequest) -> list[str]:
    """`musubi train --dry-run`: the launch's checks, then the plan; start and write nothing."""
    try:
        a = admit(req)
    except RunFinished as done:
        return [str(done)]
    lines = admission.plan_lines(a.spec, a.nproc, a.kind, a.run_dir, req.resume)
    lines += [f"resume: {c['key']} {c['before']!r} -> {c['after']!r} (--allow-changes)" for c in a.changes]
    if a.from_start:
        lines.append(f"resume: no committed checkpoint in {a.job_dir / RUN_FILES.checkpoints}: would start from step 0 "
                     "in this folder")
    skipped = [c.name for c in CHECKS if c.name == "preflight" and not req.check]
    passed = [c.name for c in CHECKS if c.name not in skipped]
    lines.append(f"checks passed: {', '.join(passed)}" + (" (preflight skipped: --no-check)" if skipped else ""))
    return lines


def run_preflight(spec: JobSpec, nproc: int, kind: str, out: Path | None, params: int | None = None,  # noqa: ANN201
                  torch_read: dict | None = None):  # PreflightReport
    """The preflight of `musubi check`, for this job's GPUs, data and output; raise PreflightFailed on a FAIL.
    `params`: the model's parameter count (built on the meta device; None when it cannot be: the disk check guesses);
    `torch_read`: torch's side of the stack reading, when another process took it."""
    from rich.console import Console

    from musubi.preflight import checkpoint_bytes_estimate, data_targets, render, run_checks

    slots = 2 if spec.train.optimizer == "adamw" else 1
    ckpt = (checkpoint_bytes_estimate(params, optimizer_slots=slots) if spec.checkpoint.enabled and params is not None
            else None) or None
    # On CPU ranks the gloo all-reduce test tells little (loopback) and costs seconds: GPU runs only.
    report = run_checks(None if kind == "cuda" else [], data_targets(spec.data), out or Path("runs"), ckpt,
                        comm=kind == "cuda", keep_checkpoints=spec.checkpoint.keep_last, cpu_ranks=nproc,
                        torch_read=torch_read)
    if report.failed or report.warnings:
        from musubi.preflight.result import PreflightReport

        # Only what needs attention; the full report goes to RUN/preflight.json.
        shown = PreflightReport(report.failed + report.warnings, report.seconds)
        render(shown, Console(stderr=True, soft_wrap=True))
    if report.failed:
        lines = "; ".join(f"{r.check}: {r.found} -> {r.fix}" for r in report.failed)
        raise PreflightFailed(f"preflight failed ({lines}); fix it or pass --no-check")
    return report
