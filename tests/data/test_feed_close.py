"""The training feed ends its loader workers when the trainer closes, not when gc finds them."""

from __future__ import annotations

import time

import psutil
import pytest
import torch

from musubi.config.job import JobSpec
from musubi.contract.world import World
from musubi.tasks.registry import build_task
from musubi.worker.feed.loaders import TrainFeed

WORLD = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie is gone, only not yet reaped
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(60)
def test_close_mid_epoch_ends_the_persistent_workers_at_once() -> None:
    """Stopped mid-epoch (max_steps), the persistent iterator still holds its worker: close() ends it in
    well under DataLoader's 5 s join timeout, which is what exits paid when gc shut it down instead."""
    spec = JobSpec(name="lm", task="lm", model="gpt", model_args={"layers": 1, "hidden": 32, "heads": 2},
                   data={"synthetic": {"train_size": 512, "val_size": 8, "seq_len": 16, "vocab": 64},
                         "workers": 1, "persistent_workers": True},
                   train={"batch": 4})
    feed = TrainFeed(build_task(spec), WORLD, batch=4, seed=0, workers=1, pin=False)
    batches = feed.epoch(0, 0)
    for _ in range(3):
        next(batches)
    pids = feed.worker_pids()
    assert pids and all(_alive(p) for p in pids)
    batches.close()  # the training loop leaves the epoch at max_steps
    t0 = time.monotonic()
    feed.close()
    took = time.monotonic() - t0
    assert not any(_alive(p) for p in pids), "a loader worker outlived close()"
    assert took < 4.0, f"close() took {took:.1f} s: the workers were killed after the 5 s join timeout, not stopped"
    assert feed.worker_pids() == []
    feed.close()  # twice is harmless (a restart path may close again)
