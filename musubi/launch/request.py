"""What `musubi train` is asked and what it answers: the request, the result, and the two ways it stops early."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from musubi.launch.multinode import DEFAULT_JOIN_TIMEOUT_S, Rendezvous


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
    rendezvous: Rendezvous | None = None  # set by the checks (launch/checks.py)
    deadline_s: float | None = None  # drills: end torchrun (and its workers) after this many seconds
    oversubscribe: bool = False  # more CPU ranks than cores, on purpose
    allow_changes: list[str] = field(default_factory=list)  # --resume: job fields that may differ (train.lr,data)
    say: Callable[[str], None] | None = None  # one line per start-up phase (the console of `musubi train`)
    #: Times of the launcher's own start-up marks (store/startup.py LAUNCHER): `entered` from the CLI (else
    #: launch_train's start), the rest from prepare(); written once the job's folder exists (it must not exist
    #: before `musubi train` makes it).
    marks: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainResult:
    """How it went: exit code, where, and the one-line error if any."""

    code: int
    run_dir: Path
    job_dir: Path
    error: str | None = None
    timed_out: bool = False  # ended by TrainRequest.deadline_s
    already_finished: bool = False  # --resume of a finished run: nothing was launched (`error` says so)


class RunFinished(Exception):
    """`--resume` of a run that already trained to its last step: nothing to launch."""

    def __init__(self, run_dir: Path, job_dir: Path) -> None:
        super().__init__(f"{job_dir}: already finished (job.json: status done); nothing to resume. To train "
                         "again, use another --out")
        self.run_dir, self.job_dir = run_dir, job_dir


class PreflightFailed(Exception):
    """The preflight found a problem: its FAIL lines are the message (exit code 1)."""
