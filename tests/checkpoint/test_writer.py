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
    def write_data(self, plan: Any, planner: Any) -> Future:
        fut = super().write_data(plan, planner)
        self.nice_seen = _nice()
        return fut


def test_a_save_written_from_a_writer_thread_is_niced_and_loads_back(tmp_path: Path) -> None:
    """As in thread mode: DCP's save runs in a thread of the rank; the writer lowers that thread only."""
    state = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "step": torch.tensor(7)}
    writer = _Recording(str(tmp_path / "ckpt"))
    mine = _nice()
    t = threading.Thread(target=lambda: dcp.save(state, storage_writer=writer, no_dist=True))
    t.start()
    t.join()
    assert writer.nice_seen == max(mine, WRITER_NICE) and _nice() == mine
    back = {"w": torch.zeros(3, 4), "step": torch.tensor(0)}
    dcp.load(back, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    assert torch.equal(back["w"], state["w"]) and int(back["step"]) == 7
