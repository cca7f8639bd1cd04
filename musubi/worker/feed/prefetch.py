"""The next batch made ready on the device while the step runs on this one.

On a CUDA rank a background thread takes each host batch from the loader (pinned
by it), and on a side stream copies it (non-blocking), decodes, resizes and
augments it; the training stream waits on an event, not the host, and the
tensors are marked as used by it (record_stream) so the allocator does not hand
their memory back to the side stream early. The host work of preparing (Python,
nvJPEG's header parsing) then overlaps the step's host work as well. The order
of batches is the loader's, so exact resume is untouched. On a CPU rank batches
are prepared inline (no stream to overlap with); `threaded=True` runs the
threaded path there too (the tests do).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

#: Batches prepared ahead on the device (each holds a decoded batch in GPU memory).
DEPTH = 2
#: Seconds between checks of the stop flag while the queue is full or empty.
POLL_S = 0.1

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
                 depth: int = DEPTH) -> None:
        self.prepare, self.device, self.depth = prepare, torch.device(device), depth
        self.threaded = self.device.type == "cuda" if threaded is None else threaded

    def describe(self) -> str:
        """One phrase for the feed's start line and summary.json."""
        if not self.threaded:
            return "inline (CPU rank)"
        where = "a side CUDA stream" if self.device.type == "cuda" else "the host"
        return f"{self.depth} batches ahead on {where}, prepared by a background thread"

    def batches(self, host_batches: Iterator[Any]) -> Iterator[Any]:
        """Device batches in the loader's order."""
        if not self.threaded:
            for host in host_batches:
                yield self.prepare(host)
            return
        q: queue.Queue[Any] = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(host_batches, q, stop), daemon=True,
                                  name="musubi-prefetch")
        thread.start()
        cuda = self.device.type == "cuda"
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, Failure):
                    raise item.error
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
        stream = torch.cuda.Stream(self.device) if cuda else None
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
            for host in host_batches:
                if stop.is_set():
                    return
                if stream is None:
                    if not put((self.prepare(host), None)):
                        return
                    continue
                if last is not None:
                    # torchvision's CUDA decode allocates its output on this stream but writes from its own
                    # without waiting for it (pytorch/vision#9606): let this stream's earlier work finish first.
                    last.synchronize()
                with torch.cuda.stream(stream):
                    batch = self.prepare(host)
                    last = torch.cuda.Event()
                    last.record(stream)
                if not put((batch, last)):
                    return
        except BaseException as e:  # noqa: BLE001 - carried to the training thread, which raises it
            put(Failure(e))
            return
        put(_DONE)
