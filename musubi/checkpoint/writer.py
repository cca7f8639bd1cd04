"""The asynchronous save's writer runs below the training thread on the CPU, never level with it.

An asynchronous save's writer (DCP's checkpoint process in `process` mode, a thread of the rank in
`thread` mode) serialises and writes the whole state while the steps run, and it inherits the rank's
CPU placement: the rank's pinned cores (worker/pinning.py), which its training thread and its loader
workers already fill. Level with them, the writer takes a share of those cores from the step for the
seconds a save lasts (issue 46: steps ran at 82 % (process) / 75 % (thread) of their speed while a
1.9 GB save was in flight). `BackgroundWriter` writes from a thread of its own at a lower priority (nice
+WRITER_NICE, Linux: nice is per thread), so the writer gets the
cycles the rank leaves idle and the save takes longer only when the cores are busy. It stays on the
rank's own cores: the machine's other cores belong to other ranks or other jobs of the fleet.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter

#: nice of the writing thread: at 10 the scheduler gives it about a tenth of a training thread's share of a
#: contended core (CFS weights 110 vs 1024); on an idle core it runs at full speed.
WRITER_NICE = 10


def lower_this_thread(nice: int = WRITER_NICE) -> int | None:
    """Lower the calling thread's CPU priority to `nice` (never raise it); its nice after, None where unsupported."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return None
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)  # on Linux, PRIO_PROCESS with a thread id: that thread only
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:  # a sandbox without setpriority: write at the rank's priority
        return None


class BackgroundWriter(FileSystemWriter):
    """DCP's file-system writer whose shards are written by a thread of their own at nice `nice` (pickled with the
    writer into DCP's checkpoint process).

    A thread per save, not the caller's: the caller in process mode is the checkpoint process's one serving
    thread, which outlives the save, and a nice once lowered cannot be raised without privileges; lowered in
    place, every later save of that process would write at the first save's nice, whatever it asked
    (bench/checkpoint.py interleaves nices in one launch). The caller waits for the thread:
    DCP's `write_data` returns once the shards are written, as before.
    """

    def __init__(self, path: str, nice: int = WRITER_NICE, copy_ahead: int | None = None) -> None:
        # copy_ahead: DCP's per_thread_copy_ahead (bytes); None keeps DCP's default (10 MB). Where CUDA is available
        # DCP's loader then syncs the writing thread's current CUDA stream every that many bytes: device 0's in a
        # thread that never chose one (a checkpoint process, a writer thread of any rank), though the tensors it
        # writes are host copies already. 0 selects DCP's serial loader: no CUDA call in the writer. Measured
        # nowhere yet: bench/checkpoint.py --writer-copy-ahead-mb 10,0 compares them on GPUs.
        if copy_ahead is None:
            super().__init__(path)
        else:
            super().__init__(path, per_thread_copy_ahead=copy_ahead)
        self.nice = nice

    def write_data(self, plan: Any, planner: Any) -> Future:
        if self.nice <= 0:
            return super().write_data(plan, planner)
        box: dict[str, Any] = {}

        def write() -> None:
            lower_this_thread(self.nice)
            try:
                box["future"] = FileSystemWriter.write_data(self, plan, planner)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it as DCP expects
                box["error"] = e

        t = threading.Thread(target=write, name="musubi-ckpt-write", daemon=True)
        t.start()
        t.join()
        if "error" in box:
            raise box["error"]
        return box["future"]
