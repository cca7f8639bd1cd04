"""Loader workers forked only when the rank is quiet, on the Pythons whose forked children can hang on a thread
entering Python during the fork (musubi/worker/feed/forking.py; python/cpython#112275)."""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset, default_collate

from musubi.config.load import job_from_dict
from musubi.contract.world import World
from musubi.tasks.registry import build_task
from musubi.worker import trainer as trainer_module
from musubi.worker.feed import loader_probe
from musubi.worker.feed import loaders as loaders_module
from musubi.worker.feed.forking import (
    fork_needs_quiet,
    quiet_before_fork,
    starts_workers,
    wait_for_quiet,
)
from musubi.worker.feed.loader_probe import measure_workers
from musubi.worker.feed.loaders import HostEpochs, TrainFeed, ValFeed
from musubi.worker.feed.sampler import ResumableDistributedSampler
from musubi.worker.trainer import RunOptions, Trainer

pytestmark = pytest.mark.timeout(120)

CPU = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")


@pytest.mark.parametrize(("version", "hangs"), [
    ((3, 10, 14), True), ((3, 10, 15), False), ((3, 11, 0), True), ((3, 11, 7), True), ((3, 11, 9), True),
    ((3, 11, 10), False), ((3, 12, 0), False), ((3, 13, 1), False),
])
def test_the_pythons_whose_forked_child_takes_the_thread_list_lock_before_renewing_it(version: tuple[int, ...],
                                                                                    hangs: bool) -> None:
    """3.11.10 and 3.10.15 carry the fix (python/cpython#112336); 3.12 renews the lock first."""
    assert fork_needs_quiet(version) is hangs


def _loader(workers: int, persistent: bool) -> DataLoader:
    ds = TensorDataset(torch.arange(8.0))
    return DataLoader(ds, batch_size=4, num_workers=workers, persistent_workers=persistent)


def test_a_loader_forks_at_every_pass_unless_its_workers_are_kept() -> None:
    assert not starts_workers(_loader(0, False))
    kept, fresh = _loader(1, True), _loader(1, False)
    assert starts_workers(kept) and starts_workers(fresh)
    for loader in (kept, fresh):
        assert len(list(loader)) == 2
    assert not starts_workers(kept)  # its workers wait for the next pass
    assert starts_workers(fresh)


def test_each_feed_settles_before_the_passes_that_fork() -> None:
    """The training reader (kept workers: the first pass forks) and the validation feed (every pass forks)."""
    calls: list[str] = []
    ds = TensorDataset(torch.arange(8.0))
    sampler = ResumableDistributedSampler(ds, 1, 0, seed=0)
    gen = torch.Generator()
    train = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=1, persistent_workers=True, generator=gen)
    reader = HostEpochs(train, sampler, gen, seed=0, batch=4)
    reader.before_fork = lambda: calls.append("train")
    assert len(list(reader.read(0, 0, 3))) == 6  # three epochs
    val = ValFeed.__new__(ValFeed)
    val.task, val.world, val.loader = SimpleNamespace(to_device=lambda b, d: b), CPU, _loader(1, False)
    val.before_fork = lambda: calls.append("val")
    for _ in range(2):
        assert len(list(val.batches())) == 2
    assert calls == ["train", "val", "val"]


def test_a_thread_running_outside_the_gil_keeps_the_rank_from_forking_until_it_sleeps() -> None:
    """Gloo's runloop creating a thread state is such a thread (forking.py); a thread hashing a large buffer, which
    runs without the GIL, stands in for it. Asleep (waiting on an event), it no longer counts."""
    go, stop = threading.Event(), threading.Event()

    def hash_until_stopped() -> None:
        data = bytes(1 << 24)
        go.set()
        while not stop.is_set():
            hashlib.sha256(data).digest()
        stop.wait()

    worker = threading.Thread(target=hash_until_stopped, daemon=True)
    worker.start()
    go.wait()
    t0 = time.monotonic()
    assert any(f"({worker.native_id})" in b for b in wait_for_quiet(timeout_s=0.3))
    assert 0.3 <= time.monotonic() - t0 < 5
    stop.set()
    worker.join()
    idle = threading.Thread(target=threading.Event().wait, args=(30,), daemon=True)
    idle.start()
    busy = wait_for_quiet(timeout_s=5)
    assert not any(f"({idle.native_id})" in b for b in busy), busy


def test_quiet_before_fork_settles_the_save_first() -> None:
    calls: list[str] = []
    quiet_before_fork(lambda: calls.append("save ended"))
    assert calls == ["save ended"]


def _trainer(tmp_path: Path) -> Trainer:
    spec = job_from_dict({
        "name": "job", "task": "lm", "model": "gpt", "model_args": {"layers": 1, "hidden": 16, "heads": 2},
        "data": {"synthetic": {"train_size": 16, "val_size": 8, "seq_len": 8, "vocab": 32}, "workers": 1},
        "train": {"epochs": 1, "batch": 4}, "checkpoint": {"async_mode": "thread"}, "telemetry": {"enabled": False},
    })
    task = build_task(spec)
    task.use_device(CPU.device)
    return Trainer(spec, task, CPU, tmp_path / "job", RunOptions())


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A gloo group of one rank, as a one-process torchrun launch has."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_trainer_settles_its_saves_before_forks_only_where_python_needs_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_rank: None) -> None:
    monkeypatch.setattr(trainer_module, "fork_needs_quiet", lambda: True)
    t = _trainer(tmp_path / "old")
    for hook in (t.val.before_fork, t.feed.reader.before_fork):  # a CPU rank reads in its own thread
        assert isinstance(hook, functools.partial) and hook.func is quiet_before_fork
        assert hook.args == (t.checkpointer.wait,)
    del t, hook  # the DDP wrapper goes before the group (gloo)
    monkeypatch.setattr(trainer_module, "fork_needs_quiet", lambda: False)
    t = _trainer(tmp_path / "new")
    assert not any(isinstance(h, functools.partial) for h in (t.val.before_fork, t.feed.reader.before_fork))
    del t


def test_the_worker_probe_waits_for_quiet_before_each_candidate_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """`data.workers: measure` forks a loader per candidate count at setup, after the process group's first
    collectives: on such a Python each waits for quiet (no save is in flight then)."""
    calls: list[int] = []
    _, rates = measure_workers(TensorDataset(torch.arange(64.0)), default_collate, batch=4, max_workers=2, batches=2,
                               before_fork=lambda: calls.append(1))
    assert len(calls) == len(rates) >= 1
    seen: dict[str, Any] = {}

    def fake_measure(*args: Any, **kwargs: Any) -> tuple[int, dict[int, float]]:
        seen.update(kwargs)
        return 1, {1: 1.0}

    monkeypatch.setattr(loader_probe, "measure_workers", fake_measure)
    spec = job_from_dict({"name": "job", "task": "lm", "model": "gpt",
                          "data": {"synthetic": {"train_size": 16, "val_size": 8, "seq_len": 8, "vocab": 32}}})
    task = build_task(spec)
    for needs, hook in ((True, wait_for_quiet), (False, None)):
        monkeypatch.setattr(loaders_module, "fork_needs_quiet", lambda needs=needs: needs)
        TrainFeed(task, CPU, 4, 0, "measure", False)
        assert (seen["before_fork"] is wait_for_quiet) == (hook is not None)
