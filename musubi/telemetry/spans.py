"""The span recorder: what each rank did in each optimizer step, without adding a sync to the step.

The loop marks section boundaries (`section("forward")`, `span("checkpoint")`,
`step_done(k)`). A boundary is one `perf_counter_ns` plus, on GPU, one CUDA
event recorded on the current stream; the background writer resolves the events
after the fact. Sections are contiguous: opening one closes the previous, so the
named sections of a step add up to its wall time (the bookkeeping after
`step_done` is a section too, `log`; the report checks the sum against the wall).

A DDP comm hook (`attach`) marks the moment the last gradient bucket is ready on
this rank: the backward section is split there into `backward` (pre-sync
compute: a slow rank is visible here, before the all-reduce evens everyone out)
and `grad_comm` (exposed wait for the gradient all-reduce).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from musubi.telemetry.sections import BACKWARD, DATA, FORWARD, GRAD_COMM, LOG
from musubi.telemetry.writer import TelemetryWriter

Boundary = tuple[int, Any]  # (perf_counter_ns, CUDA event or None)


class SpanRecorder:
    """One rank's section timer; a disabled recorder keeps the API and records only memory figures."""

    def __init__(self, path: Path, rank: int, device: torch.device, enabled: bool = True) -> None:
        self.path, self.rank, self.enabled = path, rank, enabled
        self.cuda = enabled and device.type == "cuda"
        self.writer = TelemetryWriter(path) if enabled else None
        self.companions: list[Any] = []  # sampler, watcher: closed with the recorder
        self._open: tuple[str, Boundary] | None = None
        self._segments: list[tuple[str, Boundary, Boundary]] = []
        self._step_start: Boundary | None = None
        self._sync_mark: Boundary | None = None
        # Host clock anchor (unix seconds <-> perf_counter) and, on GPU, a device clock anchor:
        # one synchronize here, at setup, so event times can be placed on the host timeline.
        self._anchor_unix, self._anchor_ns = time.time(), time.perf_counter_ns()
        self._anchor_ev = None
        if self.cuda:
            torch.cuda.synchronize(device)
            self._anchor_ev = torch.cuda.Event(enable_timing=True)
            self._anchor_ev.record()
            self._anchor_ns = time.perf_counter_ns()
            self._anchor_unix = time.time()

    # -- boundaries -------------------------------------------------------------
    def _boundary(self) -> Boundary:
        ev = None
        if self.cuda:
            # blocking: the writer thread's Event.synchronize sleeps until the GPU is there instead of spinning
            # a core for most of every GPU-bound step (CUDA's default). Spinning and sleeping events cost the
            # same within the noise (bench/telemetry_ab.py, BENCHMARKS.md: telemetry): a core freed.
            ev = torch.cuda.Event(enable_timing=True, blocking=True)
            ev.record()
        return time.perf_counter_ns(), ev

    def _close_at(self, b: Boundary) -> None:
        if self._open is None:
            return
        name, b0 = self._open
        self._open = None
        if name == BACKWARD and self._sync_mark is not None:
            self._segments.append((BACKWARD, b0, self._sync_mark))
            self._segments.append((GRAD_COMM, self._sync_mark, b))
        else:
            self._segments.append((name, b0, b))
        self._sync_mark = None

    def section(self, name: str) -> None:
        """Close the open section and open `name` (sections of a step are contiguous)."""
        if not self.enabled:
            return
        b = self._boundary()
        self._close_at(b)
        self._open = (name, b)
        if self._step_start is None:
            self._step_start = b

    def pause(self) -> None:
        """Close the open section without opening another."""
        if self.enabled and self._open is not None:
            self._close_at(self._boundary())

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Time a block as section `name` (checkpoint, eval)."""
        self.section(name)
        try:
            yield
        finally:
            self.pause()

    def timed(self, batches: Iterator[Any], name: str = DATA) -> Iterator[Any]:
        """Yield from `batches`, each wait for the next item opening section `name`."""
        it = iter(batches)
        while True:
            self.section(name)
            try:
                item = next(it)
            except StopIteration:
                self.pause()
                return
            yield item

    def presync(self) -> None:
        """Called by the comm hook when the last gradient bucket is ready (autograd thread)."""
        if self.enabled:
            self._sync_mark = self._boundary()

    def step_done(self, step: int) -> None:
        """Close optimizer step `step`: its record goes to the writer, resolved off the hot path."""
        if not self.enabled:
            return
        b = self._boundary()
        self._close_at(b)
        start = self._step_start or b
        segments, self._segments, self._step_start = self._segments, [], b
        # What follows a step until the next batch is requested is its bookkeeping (loss reduction on
        # log steps, metrics, progress bar, fault hooks): a section of the next step, not a gap.
        self._open = (LOG, b)
        self.writer.put(lambda: self._resolve("step", step, start, b, segments))

    # -- resolution (writer thread) ---------------------------------------------------
    def _unix(self, ns: int) -> float:
        return self._anchor_unix + (ns - self._anchor_ns) / 1e9

    def _resolve(self, kind: str, step: int, start: Boundary, end: Boundary,
                 segments: list[tuple[str, Boundary, Boundary]]) -> dict[str, Any]:
        t0 = self._unix(start[0])
        host: dict[str, float] = {}
        spans = []
        for name, a, b in segments:
            ms = (b[0] - a[0]) / 1e6
            host[name] = host.get(name, 0.0) + ms
            spans.append([name, round((a[0] - start[0]) / 1e6, 3), round(ms, 3)])
        rec: dict[str, Any] = {
            "kind": kind, "step": step, "rank": self.rank, "t": round(t0, 6),
            "wall_ms": round((end[0] - start[0]) / 1e6, 3),
            "host": {k: round(v, 3) for k, v in host.items()},
            "micro": sum(1 for s in segments if s[0] == FORWARD),
            "spans": spans,
        }
        if self.cuda and end[1] is not None and start[1] is not None:
            end[1].synchronize()  # this thread waits, not the step (releases the GIL)
            for _, a, b in segments:  # the comm hook's mark comes from autograd's thread: wait for it too
                a[1].synchronize()
                b[1].synchronize()
            gpu: dict[str, float] = {}
            gspans = []
            for name, a, b in segments:
                ms = a[1].elapsed_time(b[1])
                gpu[name] = gpu.get(name, 0.0) + ms
                # Device time placed on the host timeline through the anchor event.
                at = self._anchor_unix + self._anchor_ev.elapsed_time(a[1]) / 1e3
                gspans.append([name, round((at - t0) * 1e3, 3), round(ms, 3)])
            rec["gpu"] = {k: round(v, 3) for k, v in gpu.items()}
            rec["gpu_wall_ms"] = round(start[1].elapsed_time(end[1]), 3)
            rec["gpu_spans"] = gspans
        return rec

    # -- other records ---------------------------------------------------------------
    def record(self, rec: dict[str, Any]) -> None:
        """Append any record (memory figures) to this rank's file, in order with the steps."""
        if self.writer is not None:
            self.writer.put(dict(rec))
            return
        import json

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        """Record what ran after the last step (final eval, checkpoint), then stop every thread."""
        if self.enabled and self.writer is not None:
            b = self._boundary()
            self._close_at(b)
            if self._segments and self._step_start is not None:
                start, segments = self._step_start, self._segments
                self.writer.put(lambda: self._resolve("tail", -1, start, b, segments))
            self._segments = []
        if self.writer is not None:
            self.writer.close()  # first: rank 0's watch reads this file in its last poll
            self.writer = None
        for c in self.companions:
            c.close()
        self.companions = []
