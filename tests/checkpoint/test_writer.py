"""The asynchronous save's writer runs below the training thread (checkpoint/writer.py), and still writes."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from musubi.checkpoint.writer import WRITER_NICE, BackgroundWriter, lower_this_thread

pytestmark = pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread priorities are a POSIX feature")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_only_the_calling_thread_is_lowered_and_never_raised() -> None:
    mine = _nice()
    seen: list[Any] = []

    def body() -> None:
        seen.append(lower_this_thread(WRITER_NICE))
        seen.append(lower_this_thread(WRITER_NICE - 5))  # asking for less than it has: left as it is
        seen.append(_nice())

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [max(mine, WRITER_NICE)] * 3
    assert _nice() == mine  # the training thread keeps its priority
    assert lower_this_thread(0) is None  # 0: the rank's priority, nothing changed


class _Recording(BackgroundWriter):
    """Notes the nice of the thread that writes the shards, and the thread's name."""

    def __init__(self, path: str, nice: int = WRITER_NICE) -> None:
        super().__init__(path, nice)
        self.seen: list[tuple[str, int]] = []

    def write_data(self, plan: Any, planner: Any) -> Future:
        return super().write_data(plan, _NotingPlanner(planner, self.seen))


class _NotingPlanner:
    """The planner, noting (thread, nice) whenever the writer resolves an item: that is, while it writes."""

    def __init__(self, planner: Any, seen: list[tuple[str, int]]) -> None:
        self.planner, self.seen = planner, seen

    def resolve_data(self, item: Any) -> Any:
        self.seen.append((threading.current_thread().name, _nice()))
        return self.planner.resolve_data(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.planner, name)


def _state() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "step": torch.tensor(7)}


def test_a_save_written_from_a_writer_thread_is_niced_and_loads_back(tmp_path: Path) -> None:
    """As in thread mode: DCP's save runs in a thread of the rank; only the thread that writes is lowered."""
    writer = _Recording(str(tmp_path / "ckpt"))
    mine = _nice()
    callers: list[int] = []

    def save() -> None:
        dcp.save(_state(), storage_writer=writer, no_dist=True)
        callers.append(_nice())

    t = threading.Thread(target=save)
    t.start()
    t.join()
    assert writer.seen and {n for _, n in writer.seen} == {max(mine, WRITER_NICE)}
    assert {name for name, _ in writer.seen} == {"musubi-ckpt-write"}
    assert callers == [mine] and _nice() == mine  # DCP's saving thread and the training thread keep theirs
    back = {"w": torch.zeros(3, 4), "step": torch.tensor(0)}
    dcp.load(back, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    assert torch.equal(back["w"], _state()["w"]) and int(back["step"]) == 7


def test_a_long_lived_caller_writes_each_save_at_the_nice_it_asks(tmp_path: Path) -> None:
    """As in process mode: one serving thread runs every save; a nice-10 save does not leave it at nice 10
    for a nice-0 save after it."""
    mine = _nice()
    first, second = _Recording(str(tmp_path / "a")), _Recording(str(tmp_path / "b"), nice=0)

    def serve() -> None:
        dcp.save(_state(), storage_writer=first, no_dist=True)
        dcp.save(_state(), storage_writer=second, no_dist=True)

    t = threading.Thread(target=serve, name="serving")
    t.start()
    t.join()
    assert {n for _, n in first.seen} == {max(mine, WRITER_NICE)}
    assert {n for _, n in second.seen} == {mine} and {name for name, _ in second.seen} == {"serving"}


class _Failing(BackgroundWriter):
    def __init__(self, path: str) -> None:
        super().__init__(path)

    def write_data(self, plan: Any, planner: Any) -> Future:
        return super().write_data(plan, _Boom())


class _Boom:
    def resolve_data(self, item: Any) -> Any:
        raise OSError(28, "No space left on device (test)")


def test_a_write_that_fails_in_the_writing_thread_raises_in_the_caller(tmp_path: Path) -> None:
    writer = _Failing(str(tmp_path / "ckpt"))
    with pytest.raises(BaseException, match="No space left"):
        dcp.save(_state(), storage_writer=writer, no_dist=True)


def test_the_runs_last_save_writes_at_the_ranks_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save during training writes at WRITER_NICE (it yields to the steps); the run's last save, which the rank
    only waits for, at the rank's own priority (on shared cores a niced writer would yield to other jobs instead)."""
    from musubi.checkpoint import saver as saver_module
    from musubi.checkpoint.checkpoint import committed_checkpoints
    from musubi.checkpoint.states import CheckpointStates, Held
    from musubi.config.job import CheckpointSpec
    from musubi.contract.inject import Injector
    from musubi.contract.world import World

    written: list[int] = []

    class Noting(_Recording):
        def write_data(self, plan: Any, planner: Any) -> Future:
            out = super().write_data(plan, planner)
            written.append(next(n for _, n in self.seen))
            return out

    monkeypatch.setattr(saver_module, "BackgroundWriter", lambda path, nice, copy_ahead: Noting(path, nice))
    model = torch.nn.Linear(4, 2)
    states = CheckpointStates(model, torch.optim.SGD(model.parameters(), lr=0.1), train=Held({"step": 0}),
                              rank=Held({}), signature="t")
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    saver = saver_module.Checkpointer(tmp_path, CheckpointSpec(async_mode="thread"), world, Injector(None, 0, None),
                                      states)
    saver.save(2)
    saver.save(4, last=True)
    saver.close()
    assert written == [max(_nice(), WRITER_NICE), _nice()]
    assert [c.step for c in committed_checkpoints(tmp_path, warn=False)] == [2, 4]
