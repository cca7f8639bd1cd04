"""The GPU packer of one machine: which queued job starts now, on which GPUs.

List scheduling with backfill. The queue is ordered once: the previous best
model of the fleet first (a deployable model exists early), then priority, then
family (a family's jobs back to back), then larger GPU demand first (big jobs
placed before the small ones fragment the machine). Whenever GPUs are free, the
first job in that order that fits starts; while the head job waits for more GPUs,
later jobs of the same or higher priority that fit in what is free start instead
(backfill). Jobs of lower priority than a job waiting for GPUs are not backfilled
(its GPUs are reserved as they free up), so a stream of small low-priority jobs
never starves a high-priority multi-GPU job; within one priority no GPU idles
while work is queued. Jobs share a GPU only under a SharePolicy (fleet/sharing.py): two
measured single-GPU jobs, the second placed only when no GPU is free and no job before it waits for whole
GPUs. Which free GPUs a job gets is
decided by the node's topology (fleet/placement.py): the best-linked group,
leaving the best groups to the multi-GPU jobs still queued.

With predicted durations (every queued Demand has `seconds`), the order and the
GPU count of each moldable job come from a plan (fleet/moldable.py): the queue
is simulated by this same packer on a virtual clock for a few candidate orders
and widths, and the one with the shortest predicted makespan is kept; the rules
above (priority first, reservation, backfill) hold inside every candidate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from musubi.fleet.placement import choose
from musubi.fleet.sharing import SharePolicy
from musubi.topology.model import NodeTopology


@dataclass(frozen=True)
class Demand:
    """What one job asks of the machine."""

    name: str
    gpus: int
    priority: int = 0
    family: str | None = None
    first: bool = False  # the previous best model of this fleet
    after: tuple[str, ...] = ()  # jobs that must end well first
    widths: tuple[int, ...] = ()  # GPU counts it may get (a moldable job); () = exactly `gpus`
    seconds: tuple[float, ...] = ()  # predicted seconds on each of `allowed()`; () = unknown
    util: float | None = None  # recorded GPU utilisation alone on one GPU (0-1); None: unmeasured, never shares
    peak_gib: float | None = None  # recorded peak GPU memory alone on one GPU (GiB)
    shared_slowdown: float | None = None  # measured: the most it ran slower sharing a GPU; None: never shared

    def allowed(self) -> tuple[int, ...]:
        """The GPU counts this job may run on."""
        return self.widths or (self.gpus,)

    def predicted(self, width: int) -> float | None:
        """Predicted seconds on `width` GPUs (None: unknown or not an allowed width)."""
        w = self.allowed()
        return self.seconds[w.index(width)] if self.seconds and width in w else None


@dataclass
class Packer:
    """Free GPUs and the ordered queue; `place()` returns the jobs to start now."""

    gpus: list[int]
    queue: list[Demand] = field(default_factory=list)
    busy: dict[str, list[int]] = field(default_factory=dict)
    topology: NodeTopology | None = None
    reasons: dict[str, str] = field(default_factory=dict)  # job -> why it got its GPUs (latest placement)
    done: set[str] = field(default_factory=set)  # jobs that ended well (their dependents may start)
    width: dict[str, int] = field(default_factory=dict)  # queued job -> GPUs it gets (default: its `gpus`)
    keep_order: bool = False  # the queue is already in the order to keep (a simulation of a plan)
    clock: Callable[[], float] = time.monotonic  # seconds; a virtual clock in dry runs and simulations
    #: Makes a plan (fleet/moldable.best_plan) from (gpus, queue, busy, remaining seconds, done, previous plan);
    #: None: no planning, the order of `order()` and every job on its `gpus`.
    planner: Callable[..., Any] | None = None
    plan: Any = None  # the latest plan while planning
    unit: str = "GPU"  # what a device is called in the reasons ("CPU slot" for CPU ranks)
    ends: dict[str, float] = field(default_factory=dict)  # running job -> predicted end (clock seconds)
    share: SharePolicy | None = None  # two measured single-GPU jobs may share a GPU (None: never)
    running: dict[str, Demand] = field(default_factory=dict)  # what each running job asked
    #: Running (and ended) job -> the jobs that shared its GPU at some time of its run (their figures mix).
    shared_with: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free = sorted(self.gpus)
        if not self.keep_order:
            self.queue = order(self.queue)
        self.stale = True  # the plan must be made again (a job ended, or was queued again)

    @property
    def sharing(self) -> bool:
        """Whether a job may join a GPU now: a share policy, unless the latest plan turned it off (it predicted
        the fleet slower with it)."""
        return self.share is not None and (self.plan is None or bool(self.plan.share))

    def planning(self) -> bool:
        """Whether the order and widths come from a plan: every queued job has predicted durations."""
        return self.planner is not None and bool(self.queue) and all(d.seconds for d in self.queue)

    def _replan(self) -> None:
        assert self.planner is not None
        now = self.clock()
        remaining = {n: max(1.0, end - now) for n, end in self.ends.items() if n in self.busy}
        for n in self.busy:  # a running job without a prediction: assume it ends soon
            remaining.setdefault(n, 1.0)
        plan = self.planner(self.gpus, self.queue, self.busy, remaining, self.done, self.plan, share=self.share,
                            running=self.running)
        rank = {n: i for i, n in enumerate(plan.order)}
        self.queue.sort(key=lambda d: rank.get(d.name, len(rank)))
        self.width = dict(plan.widths)
        self.plan, self.stale = plan, False

    def _shared_slot(self, job: Demand) -> tuple[int, str] | None:
        """A GPU that one running job holds alone and `job` may join (the lowest summed utilisation, then the
        lowest index), and why; None when there is none or sharing is off."""
        if not self.sharing or self.share is None or job.util is None or job.peak_gib is None:
            return None
        holders: dict[int, list[str]] = {}
        for n, gs in self.busy.items():
            for g in gs:
                holders.setdefault(g, []).append(n)
        best: tuple[float, int, str] | None = None
        for g, names in holders.items():
            host = self.running.get(names[0]) if len(names) == 1 else None
            if host is None or len(self.busy[host.name]) != 1 or \
                    not self.share.fits(host.util, host.peak_gib, job.util, job.peak_gib,
                                        (host.shared_slowdown, job.shared_slowdown)):
                continue
            key = (host.util + job.util, g, host.name)  # type: ignore[operator]
            if best is None or key < best:
                best = key
        if best is None:
            return None
        host = self.running[best[2]]
        return best[1], f"shares GPU {best[1]} with {host.name}: " + self.share.why(
            host.util, host.peak_gib, job.util, job.peak_gib)  # type: ignore[arg-type]

    def place(self) -> list[tuple[Demand, list[int]]]:
        """Start every queued job that fits now, in queue order with backfill."""
        if self.stale and self.planning():
            self._replan()
        started: list[tuple[Demand, list[int]]] = []
        waiting: int | None = None  # the highest priority of a ready job that waits for more GPUs
        for job in list(self.queue):
            k = self.width.get(job.name, job.gpus)
            ready = set(job.after) <= self.done
            if ready and waiting is not None and job.priority < waiting:
                continue  # reserved: no lower-priority backfill while a higher-priority job waits for GPUs
            slot = None
            if ready and k > len(self.free):
                # A shared slot only while no job before this one waits for whole GPUs (it would wait longer).
                slot = self._shared_slot(job) if k == 1 and waiting is None else None
                if slot is None:
                    waiting = job.priority if waiting is None else max(waiting, job.priority)
            if slot is not None:
                chosen, self.reasons[job.name] = [slot[0]], slot[1]
                host = next(n for n, gs in self.busy.items() if slot[0] in gs)
                self.shared_with.setdefault(host, set()).add(job.name)
                self.shared_with[job.name] = {host}
            elif k <= len(self.free) and ready:
                behind = [(d.name, self.width.get(d.name, d.gpus)) for d in self.queue if d is not job]
                held = [g for gs in self.busy.values() for g in gs]  # running jobs give these back later
                pick = choose(self.topology, self.free, k, behind, later=held, unit=self.unit)
                chosen = list(pick.gpus)
                self.free = [g for g in self.free if g not in chosen]
                self.reasons[job.name] = pick.reason
                self.shared_with[job.name] = set()
            else:
                continue
            self.busy[job.name] = chosen
            self.running[job.name] = job
            self.queue.remove(job)
            seconds = job.predicted(k)
            if seconds is not None:
                self.ends[job.name] = self.clock() + seconds
            started.append((job, chosen))
            if not self.free and not self.sharing:
                break
        return started

    def release(self, name: str) -> None:
        """A job ended: its GPUs are free again."""
        gone = self.busy.pop(name, [])
        self.running.pop(name, None)
        held = {g for gs in self.busy.values() for g in gs}  # a GPU still shared with another job stays taken
        self.free = sorted(set(self.free) | {g for g in gone if g not in held})
        self.ends.pop(name, None)
        self.stale = True

    def drop_dependents(self, name: str) -> list[str]:
        """`name` failed for good: remove every queued job that waits on it (directly or not); their names."""
        gone: list[str] = []
        waiting = {name}
        while True:
            hit = [d for d in self.queue if waiting & set(d.after)]
            if not hit:
                return gone
            for d in hit:
                self.queue.remove(d)
                gone.append(d.name)
                waiting.add(d.name)

    def requeue(self, job: Demand) -> None:
        """A job will be retried: back in the queue at its place in the order."""
        self.queue = order([*self.queue, job])
        self.stale = True


def order(jobs: list[Demand]) -> list[Demand]:
    """Previous best first, then priority (high first), family groups, larger demand first, name."""
    family_rank: dict[str | None, int] = {}
    for j in sorted(jobs, key=lambda j: (not j.first, -j.priority)):
        family_rank.setdefault(j.family, len(family_rank))
    return sorted(jobs, key=lambda j: (not j.first, -j.priority,
                                       family_rank[j.family] if j.family is not None else 10**6,
                                       -j.gpus, j.name))


def unplaceable(jobs: list[Demand], capacity: int) -> list[str]:
    """One line per job that could never start on this machine."""
    return [f"job {j.name!r} asks for {min(j.allowed())} GPUs but this machine has {capacity}; lower its gpus:"
            for j in jobs if min(j.allowed()) > capacity]
