"""How long each job of a fleet will take on each GPU count it may get: the packer's duration model.

A job's time on w GPUs is start-up plus training (evaluation included in the
history figures):

    T(w) = S + R / (w' * e(w)),   e(w) = 1 / (1 + c * 2(w-1)/w)

S is the start-up (interpreter, torchrun, process group, model build, first
steps); R the training seconds on one GPU; w' = w when the work divides over
the ranks (epochs, or a fixed global_batch), 1 when it does not (max_steps with
a per-rank batch: more GPUs do more samples, not fewer steps); c the exposed
all-reduce per step as a fraction of the step's compute (a ring all-reduce
moves 2(w-1)/w of the gradient bytes: Amdahl's serial part grows with w).

Where the figures come from, first found first:

1. history: earlier runs of the same job (same config, or the same command) on
   the same machine (host + GPU models) and device kind, recorded in
   `musubi.db` when a job ends well at its first attempt; R and S from the
   newest, c fitted when runs at two widths exist;
2. probe: the cached single-GPU baseline (`success.baseline_steps`, real steps
   timed) times the job's sample count (synthetic data sets: train_size x
   epochs; max_steps x batch);
3. declared: the job's `expected_min` (minutes on `gpus` GPUs);
4. fallback: FALLBACK_SAMPLES_PER_S per GPU for task jobs whose sample count is
   known, else FALLBACK_S; c and S from the defaults below. A fallback orders
   jobs by size at best: say so in `--dry-run`.

The history also keeps what GPU sharing decides by (fleet/sharing.py): a job's mean GPU utilisation and
peak GPU memory, from its telemetry sampler (an external command's: the fleet's, fleet/gpu_watch.py),
recorded only for a run on one GPU it held alone; the newest such
run gives the estimate's `util` and `peak_gib` (None: never measured, so the job never shares). A run that
shared its GPU never counts as the job's duration (the other job stretched it): it is kept, marked SHARED, only
for how many times slower the job ran while shared (record_shared_run), which the plan and the share policy
then believe over their model (the estimate's `shared_slowdown`, the most of those measured).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musubi.config.fleet import CommandJob, TaskJob
from musubi.contract.run_files import RUN_FILES
from musubi.fleet.packer import Demand
from musubi.fleet.sharing import measured_slowdown
from musubi.records.evidence import gpu_peak_gib, gpu_utilisation, machine_key
from musubi.store.db import baselines_of, cache_key, job_runs, store_job_run
from musubi.store.rundir import read_jsonl

#: The detail key marking a run that shared its GPU (its partners' names).
SHARED = "shared_with"
#: Start-up of one job, seconds: ~25 s measured per job on H200 (issue 19: import, torchrun, rendezvous, NCCL
#: init, model build, cudnn autotuning); on CPU ranks the imports and the gloo group dominate.
DEFAULT_STARTUP_S = {"cuda": 25.0, "cpu": 8.0}
#: Exposed all-reduce per step over compute (c above) when no run at two widths tells: DDP overlaps most of
#: it on NVLink; gloo on CPU does not.
DEFAULT_COMM = {"cuda": 0.05, "cpu": 0.30}
#: Samples/s per GPU (CPU rank) of a task job nothing is known about: only to rank jobs by their sample counts.
FALLBACK_SAMPLES_PER_S = {"cuda": 500.0, "cpu": 20.0}
#: Seconds of a job whose sample count is unknown too (external commands, user data sets).
FALLBACK_S = {"cuda": 600.0, "cpu": 60.0}


@dataclass(frozen=True)
class Estimate:
    """One job's predicted seconds on each GPU count it may get, and where the figures came from."""

    name: str
    widths: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str  # history (N runs) | probe | declared | fallback
    startup_s: float
    comm: float
    util: float | None = None  # GPU utilisation alone on one GPU (0-1), from history; None: unmeasured
    peak_gib: float | None = None  # peak GPU memory alone on one GPU (GiB), from history
    shared_slowdown: float | None = None  # the most it ran slower while sharing a GPU (history); None: never shared

    def at(self, width: int) -> float:
        """Predicted seconds on `width` GPUs."""
        return self.seconds[self.widths.index(width)]

    @property
    def from_history(self) -> bool:
        """Whether the figures are this machine's measured runs of the job (not a probe, a declaration or the
        fallback)."""
        return self.source.startswith("history")


def demand_of(job: TaskJob | CommandJob, est: Estimate, widths: tuple[int, ...] | None = None,
              name: str | None = None, first: bool = False) -> Demand:
    """What `job` asks of the packer with its prediction `est`: its declared width when allowed, else its
    narrowest; every width's seconds when it may get several. `widths`: a subset of est's (a job held to the
    width its checkpoint was trained on); `name`: another name for it (a copy in a what-if plan)."""
    widths = widths or est.widths
    gpus = job.gpus if job.gpus in widths else widths[0]
    several = len(widths) > 1
    return Demand(name or job.name, gpus, job.priority, job.family, first=first, after=tuple(job.after),
                  widths=widths if several else (), seconds=tuple(est.at(w) for w in widths) if several
                  else (est.at(gpus),), util=est.util, peak_gib=est.peak_gib, shared_slowdown=est.shared_slowdown)


def slowdown(width: int, comm: float) -> float:
    """Step time on `width` GPUs over the step time on one (1 + c x 2(w-1)/w)."""
    return 1.0 + comm * 2.0 * (width - 1) / width


def divides(job: TaskJob | CommandJob) -> bool:
    """More GPUs mean fewer steps: the job runs epochs, or a fixed global batch."""
    return isinstance(job, TaskJob) and (job.spec.train.max_steps is None or job.spec.train.global_batch is not None)


def seconds_on(width: int, one_gpu_train_s: float, startup_s: float, comm: float, shrinks: bool) -> float:
    """T(w) = S + R / (w' e(w)) (see the module docstring)."""
    return startup_s + one_gpu_train_s * slowdown(width, comm) / (width if shrinks else 1)


def fit_comm(runs: list[dict[str, Any]], shrinks: bool) -> float | None:
    """c from two recorded runs at different widths (their training seconds), or None."""
    by_width: dict[int, dict[str, Any]] = {}
    for r in runs:
        by_width.setdefault(r["width"], r)
    if len(by_width) < 2:
        return None
    (a, ra), (b, rb) = sorted(by_width.items())[:2]
    ta = ra["seconds"] - (ra["startup_s"] or 0.0)
    tb = rb["seconds"] - (rb["startup_s"] or 0.0)
    if ta <= 0 or tb <= 0:
        return None
    # ta/tb = (slow(a)/a') / (slow(b)/b')  ->  r = slow(a)/slow(b) with r = ta a' / (tb b')
    r = (ta * (a if shrinks else 1)) / (tb * (b if shrinks else 1))
    xa, xb = 2.0 * (a - 1) / a, 2.0 * (b - 1) / b
    denom = r * xb - xa
    if abs(denom) < 1e-12:
        return None
    return min(5.0, max(0.0, (1.0 - r) / denom))


def job_key(job: TaskJob | CommandJob, machine: list[Any], kind: str) -> str:
    """What makes two runs "the same job on the same machine" for the history."""
    what: dict[str, Any] = ({"config": job.spec.resolved()} if isinstance(job, TaskJob) else
                            {"command": job.command, "python": job.python, "env": job.env, "launch": job.launch})
    return cache_key({**json.loads(json.dumps(what, default=str)), "machine": machine, "kind": kind})


def sample_count(job: TaskJob, width: int = 1) -> int | None:
    """Training samples of one run on `width` GPUs, when the config tells (synthetic data, or max_steps)."""
    train = job.spec.train
    per_step = train.global_batch or (train.batch * width * train.accumulation if isinstance(train.batch, int)
                                      else None)
    synthetic = job.spec.data.synthetic
    epoch = synthetic.train_size * train.epochs if synthetic is not None else None
    if train.max_steps is not None and per_step is not None:
        steps = train.max_steps * per_step
        return min(steps, epoch) if epoch is not None else steps
    return epoch


def estimate(job: TaskJob | CommandJob, widths: tuple[int, ...], db: Path | None, machine: list[Any],
             kind: str) -> Estimate:
    """The job's predicted seconds on each of `widths` (history, probe, declared, fallback: see above)."""
    startup, comm = DEFAULT_STARTUP_S.get(kind, 25.0), DEFAULT_COMM.get(kind, 0.05)
    shrinks = divides(job)
    # Shared runs count apart (their seconds are not the job's own): read past them for the newest ten alone.
    recorded = job_runs(db, job_key(job, machine, kind), newest=30) if db is not None else []
    runs = [r for r in recorded if not r["detail"].get(SHARED)][:10]
    one_gpu: float | None = None
    source = "fallback"
    if runs:
        newest = runs[0]
        startup = newest["startup_s"] if newest["startup_s"] is not None else min(startup, newest["seconds"] / 2)
        fitted = fit_comm(runs, shrinks)
        comm = comm if fitted is None else fitted
        w0 = newest["width"]
        one_gpu = max(0.0, newest["seconds"] - startup) * (w0 if shrinks else 1) / slowdown(w0, comm)
        source = f"history ({len(runs)} run{'s' if len(runs) > 1 else ''})"
    elif isinstance(job, TaskJob) and db is not None and (rates := baselines_of(
            db, json.loads(json.dumps(job.spec.resolved(), default=str)), machine)) and sample_count(job):
        one_gpu = (sample_count(job) or 0) / max(rates)  # type: ignore[operator]
        source = "probe"
    elif job.expected_min is not None:
        declared = job.expected_min * 60.0
        startup = min(startup, declared / 2)
        one_gpu = (declared - startup) * (job.gpus if shrinks else 1) / slowdown(job.gpus, comm)
        source = "declared"
    elif isinstance(job, TaskJob) and sample_count(job):
        one_gpu = (sample_count(job) or 0) / FALLBACK_SAMPLES_PER_S.get(kind, 500.0)
    else:  # FALLBACK_S on its declared width
        one_gpu = (FALLBACK_S.get(kind, 600.0) - startup) * (job.gpus if shrinks else 1) / slowdown(job.gpus, comm)
    seconds = tuple(round(seconds_on(w, one_gpu, startup, comm, shrinks), 3) for w in widths)
    util, peak = measured_alone(runs)
    slowed = [float(r["detail"]["shared_slowdown"]) for r in recorded
              if r["detail"].get(SHARED) and isinstance(r["detail"].get("shared_slowdown"), (int, float))]
    return Estimate(job.name, widths, seconds, source, round(startup, 3), round(comm, 4), util, peak,
                    max(slowed) if slowed else None)


def measured_alone(runs: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(GPU utilisation, peak GiB) of the newest recorded run alone on one GPU that measured both, else (None, None)."""
    for r in runs:
        d = r.get("detail") or {}
        if r["width"] == 1 and isinstance(d.get("gpu_util"), (int, float)) and isinstance(d.get("peak_gib"),
                                                                                           (int, float)):
            return float(d["gpu_util"]), float(d["peak_gib"])
    return None, None


def record_run(db: Path, job: TaskJob | CommandJob, machine: list[Any], kind: str, width: int, started: float,
               ended: float, job_dir: Path) -> None:
    """Add a clean run (first attempt, no restart, its GPUs its own) of a job to the history; start-up from its
    first log record; on one GPU its utilisation and peak memory from its telemetry (JOB/telemetry)."""
    first = next((r for r in read_jsonl(job_dir / RUN_FILES.metrics) if r.get("kind") == "train"
                  and isinstance(r.get("time"), (int, float))), None)
    startup = None
    if first is not None and started <= first["time"] <= ended:
        startup = round(first["time"] - started, 3)
    detail: dict[str, Any] = {"job_dir": str(job_dir), "recorded": time.time()}
    util = gpu_utilisation(job_dir) if width == 1 else None
    peak = gpu_peak_gib(job_dir) if util else None
    if util and peak:  # what GPU sharing decides by (its GPU held alone: the caller records no shared run)
        detail.update(gpu_util=round(max(util.values()), 3), peak_gib=round(peak, 3))
    store_job_run(db, job_key(job, machine, kind), width, round(ended - started, 3), startup, detail)


def record_shared_run(db: Path, job: TaskJob | CommandJob, machine: list[Any], kind: str, started: float,
                      ended: float, alone_s: float, overlap_s: float, partners: list[str]) -> float | None:
    """Keep what a clean run that shared its GPU for `overlap_s` seconds measured: how many times slower it ran
    while shared against `alone_s` predicted alone (sharing.measured_slowdown); the row never counts as the job's
    duration. The slowdown, or None when the overlap was too short to tell (nothing recorded)."""
    slowed = measured_slowdown(ended - started, alone_s, overlap_s)
    if slowed is None:
        return None
    store_job_run(db, job_key(job, machine, kind), 1, round(ended - started, 3), None,
                  {SHARED: sorted(partners), "overlap_s": round(overlap_s, 3), "alone_s": round(alone_s, 3),
                   "shared_slowdown": slowed, "recorded": time.time()})
    return slowed


def machine_of(env: dict[str, Any] | None) -> list[Any]:
    """The machine part of a history key (host and GPU models), JSON-shaped."""
    return json.loads(json.dumps(list(machine_key(env))))
