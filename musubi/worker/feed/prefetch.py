"""The next batch made ready on the device while the step runs on this one.

On a CUDA rank a background thread takes each host batch from the loader (pinned
by it), and on a side stream copies it (non-blocking), decodes, resizes and
augments it; the training stream waits on an event, not the host, and the
tensors are marked as used by it (record_stream) so the allocator does not hand
their memory back to the side stream early. The host work of preparing (Python,
nvJPEG's header parsing) then overlaps the step's host work as well. The order
of batches is the loader's, so exact resume is untouched. The stream a prefetcher is
given may run across epoch boundaries (worker.feed.loaders.HostEpochs): the next
epoch's first batches are then prepared while the last steps of this one run. On a CPU rank batches
are prepared inline (no stream to overlap with); `threaded=True` runs the
threaded path there too (the tests do).

The side stream has high priority: its work (converting and augmenting a batch)
is small, and the sooner it ends the sooner the thread may decode the next batch,
so it should not queue behind the step's long kernels. `clock` (a StageClock)
gets each batch's "read" (waiting for the loader), "sync" (waiting for the side
stream's previous batch), "prepare" (the task's train_batch) and the training
thread's "wait" for the next device batch; none of them synchronises.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from musubi.data.stage_clock import StageClock, timed

#: Batches prepared ahead on the device (each holds a decoded batch in GPU memory).
DEPTH = 2
#: Seconds between checks of the stop flag while the queue is full or empty.
POLL_S = 0.1
#: CUDA stream priority of the side stream (lower is more urgent; -1 is the highest PyTorch offers).
SIDE_STREAM_PRIORITY = -1

_DONE = object()


def record_stream(obj: Any, stream: torch.cuda.Stream) -> None:
    """Mark every CUDA tensor in a (nested) batch as used by `stream`."""
    if isinstance(obj, torch.Tensor):
        if obj.is_cuda:
            obj.record_stream(stream)
    elif isinstance(obj, dict):
        for v in obj.values():
            record_stream(v, stream)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            record_stream(v, stream)


class Failure:
    """An exception raised while preparing, carried to the consumer (it re-raises it there)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class DevicePrefetcher:
    """Prepare host batches on `device` one or two ahead (side stream + thread on CUDA, inline on CPU)."""

    def __init__(self, prepare: Callable[[Any], Any], device: torch.device, threaded: bool | None = None,
                 depth: int = DEPTH, clock: StageClock | None = None) -> None:
        self.prepare, self.device, self.depth = prepare, torch.device(device), depth
        self.threaded = self.device.type == "cuda" if threaded is None else threaded
        #: read / sync / prepare / wait per batch (summary.json's loader.times, bench/data.py).
        self.clock = clock if clock is not None else StageClock()

    def describe(self) -> str:
        """One phrase for the feed's start line and summary.json."""
        if not self.threaded:
            return "inline (CPU rank)"
        where = "a high-priority side CUDA stream" if self.device.type == "cuda" else "the host"
        return f"{self.depth} batches ahead on {where}, prepared by a background thread"

    def batches(self, host_batches: Iterator[Any]) -> Iterator[Any]:
        """Device batches in the loader's order."""
        clock = self.clock
        if not self.threaded:
            asked = time.perf_counter()
            for host in timed_reads(host_batches, clock):
                with timed(clock, "prepare"):
                    batch = self.prepare(host)
                clock.add("wait", time.perf_counter() - asked)  # all of it: nothing was prepared ahead
                yield batch
                asked = time.perf_counter()
            return
        q: queue.Queue[Any] = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(host_batches, q, stop), daemon=True,
                                  name="musubi-prefetch")
        thread.start()
        cuda = self.device.type == "cuda"
        try:
            while True:
                asked = time.perf_counter()
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, Failure):
                    raise item.error
                clock.add("wait", time.perf_counter() - asked)
                batch, ready = item
                if cuda:
                    main = torch.cuda.current_stream(self.device)
                    main.wait_event(ready)  # the GPU waits, not the host
                    record_stream(batch, main)
                yield batch
        finally:
            stop.set()
            with contextlib.suppress(queue.Empty):
                while True:
                    q.get_nowait()  # unblock a producer waiting to put
            thread.join(timeout=5)

    def _produce(self, host_batches: Iterator[Any], q: queue.Queue[Any], stop: threading.Event) -> None:
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device, priority=SIDE_STREAM_PRIORITY) if cuda else None
        clock = self.clock
        last: torch.cuda.Event | None = None

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=POLL_S)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            if cuda:
                torch.cuda.set_device(self.device)  # a new thread starts on cuda:0
            for host in timed_reads(host_batches, clock):
                if stop.is_set():
                    return
                if stream is None:
                    with timed(clock, "prepare"):
                        batch = self.prepare(host)
                    if not put((batch, None)):
                        return
                    continue
                if last is not None:
                    # torchvision's CUDA decode allocates its output on this stream but writes from its own
                    # without waiting for it (pytorch/vision#9606): let this stream's earlier work finish first.
                    with timed(clock, "sync"):
                        last.synchronize()
                with torch.cuda.stream(stream):
                    with timed(clock, "prepare", self.device):
                        batch = self.prepare(host)
                    last = torch.cuda.Event()
                    last.record(stream)
                if not put((batch, last)):
                    return
        except BaseException as e:  # noqa: BLE001 - carried to the training thread, which raises it
            put(Failure(e))
            return
        put(_DONE)


def timed_reads(batches: Iterator[Any], clock: StageClock) -> Iterator[Any]:
    """`batches` with each next() timed as the stage "read" (the wait for the loader's workers)."""
    it = iter(batches)
    while True:
        started = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            return
        clock.add("read", time.perf_counter() - started)
        yield item
