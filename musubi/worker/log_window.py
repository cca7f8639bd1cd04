"""What a log line averages, and reading it without making the host wait for the GPU.

A log line needs the mean loss over all ranks. Reading it at once (`.item()` after the all-reduce) makes
the host wait until the GPU has run every step queued so far: the GPU then idles while the host queues the
next step's first kernels. Measured with bench/loop_ab.py, that wait every 10 steps cost as much as the
rest of the loop (BENCHMARKS.md, training loop). So a log step only queues the
all-reduce and a copy of the sum to pinned host memory behind a CUDA event; the line is read and written at
the next log step, when that copy is long done, or earlier where the run needs the figure now (before a
checkpoint, so a non-finite loss never lands in one; before validation; at the end of training).
Every rank reads the same all-reduced value at the same places, so all stop together on a non-finite loss.

The loss's named parts (Task.loss: a detector's box, class and objectness terms) ride along: summed on the device
beside the total, all-reduced and copied in the same buffer, so they cost no host sync either. Their names are
fixed by the first micro-batch that has them, and the ranks agree on them once (`part_fingerprint`) before any
line is queued: the buffer's length must be the same on every rank, or the all-reduce would hang. A part a
micro-batch lacks is averaged over the micro-batches that had it; a loss of one part is its total, not logged twice.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


class LogWindow:
    """Loss and throughput since the last log line: summed on the device, read once per log interval."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        self.micro = 0  # micro-batch losses in loss_sum
        self.samples = 0  # samples of all ranks since t0
        self.t0 = time.perf_counter()
        #: The loss parts summed (None: not seen yet); fixed by the first micro-batch with two or more.
        self.part_names: tuple[str, ...] | None = None
        self.part_sums: torch.Tensor | None = None  # [2, K] float64: row 0 the parts' sums, row 1 their counts

    def add(self, loss: torch.Tensor, samples: int, parts: dict[str, Any] | None = None) -> None:
        """One micro-batch's loss and named parts (no host sync) and its samples over all ranks."""
        self.loss_sum += loss.detach().double()
        self.micro += 1
        self.samples += samples
        if parts and (self.part_names is None or self.part_names):
            self._add_parts(parts)

    def _add_parts(self, parts: dict[str, Any]) -> None:
        # Scalars only: a part of another shape has no one figure to log.
        scalars = {k: v for k, v in parts.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   or isinstance(v, torch.Tensor) and v.numel() == 1}
        if self.part_names is None:
            # A loss of one part is the total itself (classification's "ce"): nothing more to log.
            self.part_names = tuple(scalars) if len(scalars) > 1 else ()
            if self.part_names:
                self.part_sums = torch.zeros((2, len(self.part_names)), device=self.device, dtype=torch.float64)
        sums = self.part_sums
        if sums is None:
            return
        if tuple(scalars) == self.part_names and all(isinstance(v, torch.Tensor) for v in scalars.values()):
            # The usual case: every part, a tensor, in order: stacked and added in a few kernels.
            values = torch.stack([v.detach().reshape(()).to(torch.float64) for v in scalars.values()])
            sums[0] += values
            sums[1] += 1
            return
        for i, name in enumerate(self.part_names):
            value = scalars.get(name)
            if value is None:
                continue
            # A Python number is a kernel argument; a tensor is added on its device: no host sync either way.
            sums[0, i] += value.detach().reshape(()).double() if isinstance(value, torch.Tensor) else float(value)
            sums[1, i] += 1

    def drop_parts(self) -> None:
        """Log no parts from now on (the ranks did not agree on their names: `part_fingerprint`)."""
        self.part_names, self.part_sums = (), None

    def restart(self, now: float) -> None:
        """Throughput counts from `now` (perf_counter seconds)."""
        self.t0, self.samples = now, 0


class NonFiniteLoss(FloatingPointError):
    """The all-reduced mean loss of a log interval is NaN or infinite (every rank raises it at the same place)."""

    def __init__(self, value: float, step: int) -> None:
        super().__init__(f"loss is {value} at step {step}")
        self.step = step


def part_fingerprint(names: tuple[str, ...] | None) -> int:
    """A number every rank that sums the same parts computes alike (CRC-32 of the names, 0 for none)."""
    return zlib.crc32("\0".join(names).encode()) + 1 if names else 0


def agree_parts(win: LogWindow, reduce_min: Callable[[int], int], reduce_max: Callable[[int], int]) -> bool:
    """Whether every rank sums the same loss parts (`reduce_min`/`reduce_max`: an integer's minimum/maximum over
    ranks, World.all_reduce_min/max); otherwise, or when there are none, `win` logs no part from now on.

    Called by every rank at the same place, once, before the first line is queued (two small collectives).
    """
    mine = part_fingerprint(win.part_names)
    agreed = reduce_min(mine) == reduce_max(mine)
    if not agreed or not win.part_names:
        win.drop_parts()  # none by the first step: none later either, since later names were never agreed
    return agreed


def part_key(name: str) -> str:
    """The metrics record's key of a loss part: its name, prefixed `loss_` where it has no such prefix."""
    return name if name.startswith("loss_") else f"loss_{name}"


@dataclass
class PendingLine:
    """A log step's figures, its loss sum on its way to the host."""

    step: int
    #: The all-reduced sums, pinned host memory (filled when `done` has passed): [1 + 2K] float64, the loss
    #: sum, then the K parts' sums, then their counts.
    loss_host: torch.Tensor
    done: torch.cuda.Event | None  # recorded after the copy (None: a CPU rank, copied already)
    losses: int  # micro-batch losses summed over all ranks
    samples_per_s: float
    wall_time: float  # time.time() when the step was queued: the metrics record's time
    values: dict[str, Any] = field(default_factory=dict)  # the rest of the record, as it was at the step
    part_names: tuple[str, ...] = ()

    def mean_loss(self) -> float:
        """The interval's mean loss (waits for the copy, long finished when read at the next log step)."""
        if self.done is not None:
            self.done.synchronize()
        return self.loss_host[0].item() / self.losses

    def mean_parts(self) -> dict[str, float]:
        """Each loss part's mean over the micro-batches (all ranks) that had it, by its record key (part_key);
        a part no micro-batch had, or a non-finite one, is left out."""
        if self.done is not None:
            self.done.synchronize()
        k = len(self.part_names)
        values = self.loss_host.tolist()
        sums, counts = values[1:1 + k], values[1 + k:1 + 2 * k]
        return {part_key(name): total / n for name, total, n in zip(self.part_names, sums, counts, strict=True)
                if n > 0 and math.isfinite(total)}


def queue_line(win: LogWindow, step: int, world_size: int, reduce: Callable[[torch.Tensor], Any], now: float,
               values: dict[str, Any]) -> PendingLine:
    """Queue the all-reduce of `win`'s loss sum and its copy to the host; restart the window at `now`.

    `values`: the record's other figures as they are at this step (LR, epoch, memory). `reduce` sums a tensor
    over ranks in place (World.all_reduce_sum). The window's sum is cleared after the copy on the same stream,
    so the next interval starts from zero without waiting for it.
    """
    names = win.part_names or ()
    # One buffer, one all-reduce, one copy: the total, then the parts' sums and counts (part_fingerprint made
    # sure every rank's is as long).
    sums = win.loss_sum.reshape(1) if win.part_sums is None else torch.cat([win.loss_sum.reshape(1),
                                                                              win.part_sums.reshape(-1)])
    reduce(sums)
    cuda = sums.is_cuda
    host = torch.empty(sums.shape, dtype=torch.float64, pin_memory=cuda)
    host.copy_(sums, non_blocking=cuda)
    done = None
    if cuda:
        done = torch.cuda.Event()
        done.record()
    line = PendingLine(step, host, done, win.micro * world_size, win.samples / max(now - win.t0, 1e-9), time.time(),
                       values, names)
    win.loss_sum.zero_()
    if win.part_sums is not None:
        win.part_sums.zero_()
    win.micro = 0
    win.restart(now)
    return line


def check_finite(value: float, step: int) -> None:
    """Raise NonFiniteLoss for a NaN or infinite mean loss."""
    if not math.isfinite(value):
        raise NonFiniteLoss(value, step)
