"""Where preparing batches spends its time: host milliseconds and device milliseconds per named stage.

The feeder's hot path only reads the host clock and, on a CUDA rank, records two
timing events on the current stream per stage; the events are read later, once
`query()` says they have completed (it never waits), so measuring adds no
synchronisation. Host time of a stage that ends in a blocking call (nvJPEG's
decode waits for its own stream) is its device time as well; device time of a
stage that only queues kernels is the span between its events on the stream, a
kernel starved by the training step included. summary.json (`loader.times`) and
bench/data.py show the per-batch means.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

#: Event pairs kept unread before the completed ones are read (a bound on memory, not a wait).
MAX_PENDING = 64


class StageClock:
    """Host and device time per stage, summed over the batches since the last reset (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the prefetch thread and the training thread both record
        self.counts: dict[str, int] = {}
        self.host_s: dict[str, float] = {}
        self.device_ms: dict[str, float] = {}
        self.device_counts: dict[str, int] = {}
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def reset(self) -> None:
        """Forget what was measured (a bench clears the warm-up steps)."""
        with self._lock:
            for table in (self.counts, self.host_s, self.device_ms, self.device_counts):
                table.clear()
            self._pending.clear()

    @contextmanager
    def stage(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        """Time the body as one batch of stage `name` (device time too when `device` is CUDA)."""
        events = None
        if device is not None and device.type == "cuda":
            stream = torch.cuda.current_stream(device)
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record(stream)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - t0
            if events is not None:
                events[1].record(stream)
            self.add(name, seconds, events)

    def add(self, name: str, seconds: float,
            events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None) -> None:
        """Count one batch of `name` that took `seconds` on the host (and the span of `events` on the device)."""
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + 1
            self.host_s[name] = self.host_s.get(name, 0.0) + seconds
            if events is not None:
                self._pending.append((name, *events))
                if len(self._pending) > MAX_PENDING:
                    self._settle()

    def _settle(self) -> None:
        left = []
        for name, start, end in self._pending:
            if end.query():  # completed: reading the span does not wait
                self.device_ms[name] = self.device_ms.get(name, 0.0) + start.elapsed_time(end)
                self.device_counts[name] = self.device_counts.get(name, 0) + 1
            else:
                left.append((name, start, end))
        self._pending = left

    def record(self) -> dict[str, dict[str, float]]:
        """{stage: {"batches", "host_ms" (mean a batch), "device_ms" (mean of the completed ones)}}."""
        with self._lock:
            self._settle()
            out: dict[str, dict[str, float]] = {}
            for name, n in self.counts.items():
                row = {"batches": n, "host_ms": round(1000 * self.host_s[name] / n, 3)}
                if self.device_counts.get(name):
                    row["device_ms"] = round(self.device_ms[name] / self.device_counts[name], 3)
                out[name] = row
            return out


def timed(clock: StageClock | None, name: str, device: torch.device | None = None) -> AbstractContextManager[None]:
    """`clock.stage(name, device)`, or nothing when there is no clock."""
    return clock.stage(name, device) if clock is not None else nullcontext()
