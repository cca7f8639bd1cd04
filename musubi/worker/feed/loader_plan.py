"""How a rank's data loader is shaped: workers, pinning, prefetch, persistence, from config and machine."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

#: The most loader workers `data.workers: auto` starts per rank.
MAX_AUTO_WORKERS = 16


#: Loader workers per rank when `data.workers` is unset, on a rank with cores to spare for them.
DEFAULT_WORKERS = 2


def workers_for_cores(cores: int) -> int:
    """Loader workers for `data.workers: auto`: every core but one (the training loop's), at most 16."""
    return max(0, min(MAX_AUTO_WORKERS, cores - 1))


def default_workers(cores: int) -> int:
    """Loader workers when `data.workers` is unset: DEFAULT_WORKERS, fewer on a rank with fewer cores to spare (a
    core stays the training loop's), so the default never oversubscribes the rank it runs on."""
    return min(DEFAULT_WORKERS, workers_for_cores(cores))


@dataclass(frozen=True)
class LoaderPlan:
    """DataLoader keyword arguments of one rank."""

    workers: int
    pin_memory: bool
    prefetch: int
    persistent: bool
    #: How `workers` was chosen: "config" or "auto (N cores for this rank)".
    source: str = "config"
    #: Where the feed's work runs (the training feed fills it): decode, resize, augment, ahead.
    path: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """summary.json's `loader`: the values the rank's DataLoader got, where `workers` came from, the path."""
        out: dict[str, Any] = {"workers": self.workers, "workers_from": self.source, "pin_memory": self.pin_memory,
                               "prefetch": self.prefetch if self.workers > 0 else None,
                               "persistent_workers": self.persistent and self.workers > 0}
        return {**out, **self.path}

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for torch.utils.data.DataLoader."""
        return {"num_workers": self.workers, "pin_memory": self.pin_memory,
                "persistent_workers": self.persistent and self.workers > 0,
                "prefetch_factor": self.prefetch if self.workers > 0 else None}


def cores_of_rank(local_ranks: int) -> int:
    """CPU cores this rank may use: its affinity set when a binder narrowed it, else an equal share."""
    total = os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        allowed = total
    if allowed < total:  # pinned (musubi binding, taskset, Slurm): the set is already this rank's
        return allowed
    return max(1, total // max(1, local_ranks))


def auto_workers(local_ranks: int) -> int:
    """Workers per rank: its cores minus one for the training process itself, at least 1."""
    return max(1, workers_for_cores(cores_of_rank(local_ranks)))


def plan_loader(workers: int | str, pin_memory: bool, prefetch: int, persistent: bool, is_cuda: bool,
                local_ranks: int | None = None) -> LoaderPlan:
    """The loader plan of one rank (local_ranks default: torchrun's LOCAL_WORLD_SIZE)."""
    if local_ranks is None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # `measure` is resolved by the training feed (loader_probe); anywhere else it means `auto`.
    n = auto_workers(local_ranks) if workers in ("auto", "measure") else int(workers)
    source = f"auto ({cores_of_rank(local_ranks)} cores for this rank)" if workers in ("auto", "measure") else "config"
    return LoaderPlan(workers=n, pin_memory=pin_memory and is_cuda, prefetch=prefetch, persistent=persistent,
                      source=source)
