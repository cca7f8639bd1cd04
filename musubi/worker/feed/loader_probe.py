"""`data.workers: measure`: time the real loader at a few worker counts and keep the smallest that feeds best.

Each candidate (1, 2, 4, ... up to the rank's `auto` count) reads `batches` batches
of the training set through a DataLoader shaped like the real one (same collate,
prefetch and pinning); the first batch (worker start-up) is not timed. The search
stops once doubling the workers gains less than GAIN, and the smallest count
within KEEP of the best rate wins: workers cost RAM and cores, so more are only
taken when they are measured to help.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

log = logging.getLogger(__name__)

#: Doubling the workers must raise the rate by this factor to keep searching.
GAIN = 1.1
#: The chosen count's rate is at least this share of the best one measured.
KEEP = 0.95


def candidates(max_workers: int) -> list[int]:
    """1, 2, 4, ... and `max_workers` itself (at least [1]; 0 workers never competes: no prefetch overlap)."""
    out, n = [], 1
    while n < max_workers:
        out.append(n)
        n *= 2
    return [*out, max(1, max_workers)]


def measure_workers(ds: Dataset, collate: Callable[[list[Any]], Any], batch: int, max_workers: int,
                    prefetch: int = 2, pin: bool = False, batches: int = 6, seed: int = 0,
                    clock: Callable[[], float] = time.perf_counter) -> tuple[int, dict[int, float]]:
    """(workers chosen, samples/s per count tried) for this dataset, batch and machine."""
    rates: dict[int, float] = {}
    n_samples = batch * (batches + 1)
    for w in candidates(max_workers):
        g = torch.Generator()
        g.manual_seed(seed)
        sampler = RandomSampler(ds, replacement=len(ds) < n_samples, num_samples=n_samples,  # type: ignore[arg-type]
                                generator=g)
        loader = DataLoader(ds, batch_size=batch, sampler=sampler, collate_fn=collate, num_workers=w,
                            prefetch_factor=prefetch, pin_memory=pin, drop_last=True)
        it = iter(loader)
        next(it)  # worker start-up and the first decode: not the steady state
        t0 = clock()
        got = sum(1 for _ in it)
        rates[w] = got * batch / max(clock() - t0, 1e-9)
        del it, loader
        previous = [r for k, r in rates.items() if k < w]
        if previous and rates[w] < GAIN * max(previous):
            break  # saturated (cores, disk or the GIL): more workers only cost memory
    best = max(rates.values())
    chosen = min(k for k, r in rates.items() if r >= KEEP * best)
    log.info("loader workers measured: %s samples/s -> %d workers",
             ", ".join(f"{k}: {r:.0f}" for k, r in rates.items()), chosen)
    return chosen, rates
