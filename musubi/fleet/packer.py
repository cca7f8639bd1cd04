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
while work is queued. Jobs never share a GPU. Which free GPUs a job gets is
decided by the node's topology (fleet/placement.py): the best-linked group,
leaving the best groups to the multi-GPU jobs still queued.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from musubi.fleet.placement import choose
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


@dataclass
class Packer:
    """Free GPUs and the ordered queue; `place()` returns the jobs to start now."""

    gpus: list[int]
    queue: list[Demand] = field(default_factory=list)
    busy: dict[str, list[int]] = field(default_factory=dict)
    topology: NodeTopology | None = None
    reasons: dict[str, str] = field(default_factory=dict)  # job -> why it got its GPUs (latest placement)
    done: set[str] = field(default_factory=set)  # jobs that ended well (their dependents may start)

    def __post_init__(self) -> None:
        self.free = sorted(self.gpus)
        self.queue = order(self.queue)

    def place(self) -> list[tuple[Demand, list[int]]]:
        """Start every queued job that fits now, in queue order with backfill."""
        started: list[tuple[Demand, list[int]]] = []
        waiting: int | None = None  # the highest priority of a ready job that waits for more GPUs
        for job in list(self.queue):
            ready = set(job.after) <= self.done
            if ready and waiting is not None and job.priority < waiting:
                continue  # reserved: no lower-priority backfill while a higher-priority job waits for GPUs
            if ready and job.gpus > len(self.free):
                waiting = job.priority if waiting is None else max(waiting, job.priority)
            if job.gpus <= len(self.free) and ready:
                behind = [(d.name, d.gpus) for d in self.queue if d is not job]
                held = [g for gs in self.busy.values() for g in gs]  # running jobs give these back later
                pick = choose(self.topology, self.free, job.gpus, behind, later=held)
                chosen = list(pick.gpus)
                self.free = [g for g in self.free if g not in chosen]
                self.busy[job.name] = chosen
                self.reasons[job.name] = pick.reason
                self.queue.remove(job)
                started.append((job, chosen))
            if not self.free:
                break
        return started

    def release(self, name: str) -> None:
        """A job ended: its GPUs are free again."""
        self.free = sorted(self.free + self.busy.pop(name, []))

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
    return [f"job {j.name!r} asks for {j.gpus} GPUs but this machine has {capacity}; lower its gpus:"
            for j in jobs if j.gpus > capacity]
