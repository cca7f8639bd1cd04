"""Rank side of CPU pinning: this rank (all its threads) and its data-loader workers on its own cores.

The launcher puts one cpulist per local rank in MUSUBI_CPUS (launch/pin_plan.py).
A rank pins itself first thing, before torch starts its thread pools, so every
thread it creates afterwards (intra-op pool, pin-memory thread, NCCL's threads)
and every loader worker it forks inherits the same cores. Intra-op threads =
cores - loader workers (at least 1): the workers decode on the other cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from musubi.contract.env import MUSUBI_CPUS
from musubi.topology.model import format_cpulist, parse_cpulist
from musubi.worker.feed.loader_plan import (
    DEFAULT_WORKERS,
    MAX_AUTO_WORKERS,  # noqa: F401 - re-exported
    default_workers,
)
from musubi.worker.feed.loader_plan import workers_for_cores as auto_workers

#: `data.workers: auto` never starts more loader processes than this per rank.


@dataclass(frozen=True)
class Pinning:
    """The cores this rank runs on."""

    cpus: tuple[int, ...]

    @property
    def cores(self) -> int:
        """Number of logical CPUs of this rank."""
        return len(self.cpus)

    def describe(self) -> str:
        """'cores 0-7 (8 cores)', 'core 3 (1 core)': the core ids, then how many (an id alone reads as a count)."""
        many = self.cores != 1
        return f"core{'s' if many else ''} {format_cpulist(self.cpus)} ({self.cores} core{'s' if many else ''})"


def rank_cpus(local_rank: int, value: str | None) -> tuple[int, ...] | None:
    """This local rank's cores from a MUSUBI_CPUS value ('0-7;8-15'), None when none is given for it."""
    if not value:
        return None
    parts = value.split(";")
    if local_rank >= len(parts):
        return None
    return parse_cpulist(parts[local_rank]) or None


def pin_all_threads(cpus: tuple[int, ...]) -> None:
    """Pin this thread and every other thread of the process to `cpus` (new threads and forks inherit it)."""
    os.sched_setaffinity(0, cpus)
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread ended meanwhile
            pass


def pin_rank(local_rank: int, env: dict[str, str] | None = None) -> Pinning | None:
    """Pin this process to its cores from MUSUBI_CPUS; None (nothing done) without a set or off Linux."""
    cpus = rank_cpus(local_rank, (env if env is not None else os.environ).get(MUSUBI_CPUS))
    if cpus is None or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    usable = tuple(c for c in cpus if c in allowed)
    if not usable:  # a set from another machine (or a narrower cgroup): pinning to it would fail
        return None
    pin_all_threads(usable)
    return Pinning(usable)


def intra_op_threads(cores: int, workers: int) -> int:
    """torch intra-op threads of a rank with `cores` cores, `workers` of them busy decoding: at least 1."""
    return max(1, cores - workers)


def unpinned_cores(world_size_on_node: int) -> int:
    """A rank's share of the cores when it is not pinned (the same share the launcher gives OMP)."""
    try:
        total = len(os.sched_getaffinity(0))
    except AttributeError:
        total = os.cpu_count() or 1
    return max(1, total // max(1, world_size_on_node))


#: The words of `configure_threads`' line when the loader workers outnumber the rank's cores.
OVERSUBSCRIBED = "oversubscribe them"


def configure_threads(spec, pinned: Pinning | None) -> str:  # noqa: ANN001 - a JobSpec (no config import here)
    """Resolve `data.workers: auto` and set torch's intra-op threads from this rank's cores; a line for the log."""
    import torch

    cores = pinned.cores if pinned is not None else unpinned_cores(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    chosen = ""
    if spec.data.workers is None:
        spec.data.workers = default_workers(cores)
        if spec.data.workers < DEFAULT_WORKERS:  # said in the same line: why this rank loads with fewer
            chosen = f" (default {DEFAULT_WORKERS} fitted to {cores} core(s); data.workers sets it)"
    if spec.data.workers == "auto":
        spec.data.workers = auto_workers(cores)
    # `measure`: the feed times the loader later, at most `auto` workers; threads are planned for that many.
    workers = auto_workers(cores) if spec.data.workers == "measure" else spec.data.workers
    said = "up to " + str(workers) + " (measured)" if spec.data.workers == "measure" else str(workers)
    if pinned is None:  # not pinned: threads as OMP_NUM_THREADS says (the launcher's share of the cores)
        return f"not pinned: {torch.get_num_threads()} intra-op thread(s), {said} loader worker(s){chosen}"
    threads = intra_op_threads(cores, workers)
    torch.set_num_threads(threads)
    line = f"{pinned.describe()}: {threads} intra-op thread(s), {said} loader worker(s){chosen}"
    if isinstance(spec.data.workers, int) and spec.data.workers >= cores:
        # Said, not silently clamped: the workers and the training loop now share too few cores.
        # The caller logs the line once, at warning level (OVERSUBSCRIBED in it): one line, not two.
        line += (f"; warning: {spec.data.workers} loader workers on {cores} pinned core(s) {OVERSUBSCRIBED} "
                 f"(data.workers: auto gives {auto_workers(cores)})")
    return line
