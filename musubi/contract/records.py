"""The records one process writes and another reads, as typed shapes (JSON objects on disk).

A rank writes them; the launcher, a restarted rank, goodput, the drill and the report read them.
Each is a TypedDict, so the writer builds it by name (`OomRecord(rank=..., ...)`, a plain dict at
run time) and a reader sees which keys to expect. Where each lives: RUN_FILES (run_files.py).
"""

from __future__ import annotations

from typing import TypedDict


class ErrorLine(TypedDict):
    """logs/error-rank{r}.txt: why a rank failed, in one line (cleared by the next attempt)."""

    kind: str  # "config", "oom", "numerics", "defect", or the exception's type name
    message: str


class _ExitRecordBase(TypedDict):
    rank: int
    kind: str  # as ErrorLine.kind
    message: str  # at most 500 characters
    time: float  # wall-clock seconds


class ExitRecord(_ExitRecordBase, total=False):
    """logs/exits/a{attempt}-rank{r}.json: one failed rank of one attempt (kept across attempts, read by goodput)."""

    site: str  # "file:line in function" where the exception was raised (recovery/repeats.exception_site)
    ours: str  # the innermost frame inside musubi, when `site` is outside it


class _OomRecordBase(TypedDict):
    rank: int
    step: int  # the optimizer step that ran out of memory
    phase: str  # forward, backward or optimizer
    per_rank: int  # samples per rank per micro-batch when it happened
    accumulation: int  # micro-batches per optimizer step
    steps_done: int  # optimizer steps this attempt completed before the OOM (0: the batch never fit)
    time: float  # wall-clock seconds
    error: str  # the OOM message, at most 300 characters


class OomRecord(_OomRecordBase, total=False):
    """memory/oom-{ms}-rank{r}.json (renamed applied-oom-... once applied): read by every rank after the restart."""

    mem_allocated_gib: float  # recovery/memory.memory_figures: the allocator's state at the OOM
    mem_reserved_gib: float
    mem_peak_allocated_gib: float
    mem_peak_reserved_gib: float
    mem_fragmentation_gib: float
    mem_alloc_retries: int
    mem_total_gib: float
    mem_free_gib: float


class ProgressLine(TypedDict, total=False):
    """One line of progress/a{attempt}.jsonl, rank 0's progress of an attempt (goodput, the launcher)."""

    event: str  # "start", "train_start" or "end"; absent on a plain step line
    t: float  # wall-clock seconds
    attempt: str  # on "start": launch.restart, e.g. "1.0"
    step: int  # the optimizer step reached


class StartupMark(TypedDict):
    """One line of startup.jsonl: a process of the job passed a start-up mark (store/startup.py)."""

    mark: str  # "entered", "world", "first_step", ... (store/startup.py lists them)
    time: float  # wall-clock seconds
    pid: int


class HeartbeatRecord(TypedDict):
    """heartbeat/a{attempt}-rank{r}.json: a rank's last sign of life (watchdog peers, goodput, the drill)."""

    rank: int
    pid: int
    launched_pid: int  # the pid torchrun knows the rank by (the warm spare's client; else `pid`)
    host: str
    attempt: str
    step: int
    phase: str  # the step phase the rank is in (data, forward, backward, optimizer, ...)
    seq: int  # moves on every phase change and step: a frozen seq is a hang
    time: float  # wall-clock seconds of this write
    timeout_s: float  # how long the peers wait for this phase
    t_train_start: float | None
    resumed_step: int | None


class TaskQuery(TypedDict):
    """What the launcher asks of the process that builds the job's task with torch (launch/task_checks.py): a
    child of its warm spare, JSON in the spare's folder (or a call in the launcher itself when it has no spare)."""

    config: dict  # the job's resolved config (JobSpec.resolved(), what job.json will hold)
    validate: bool  # run the task's own checks (Task.validate; a fleet ran them before it started any job)
    metrics: bool  # read the metric names its validation reports (Task.metric_names, primary_metric)
    signature: bool  # the signature of the model built on the meta device (a changed --resume compares it)
    params: bool  # its parameter count (the preflight's checkpoint-size estimate)
    stack: bool  # torch's side of the preflight's stack reading (version, CUDA, NCCL, gloo)


class TaskReadings(TypedDict, total=False):
    """The answer to a TaskQuery: what was read, or the one line that refused the job (a key absent: not asked,
    or, for signature and params, a model that cannot be built on the meta device)."""

    error: str  # the ConfigError of the task's own checks (the launch exits EXIT_CONFIG with it)
    crashed: str  # any other exception's "Type: message": the launcher reruns the checks itself, to raise it
    metric_names: list[str] | None  # None: the task declares none
    primary_metric: str
    signature: str
    params: int
    stack: dict  # preflight/read/machine.py torch_side()
