"""What a log line averages, and reading it without making the host wait for the GPU.

A log line needs the mean loss over all ranks. Reading it at once (`.item()` after the all-reduce) makes
the host wait until the GPU has run every step queued so far: the GPU then idles while the host queues the
next step's first kernels. On one H200 (2026-11-27, bench/loop_ab.py, resnet50 bs256 bf16) that wait every
10 steps cost 0.7 % of the step time, as much as the rest of the loop. So a log step only queues the
all-reduce and a copy of the sum to pinned host memory behind a CUDA event; the line is read and written at
the next log step, when that copy is long done, or earlier where the run needs the figure now (before a
checkpoint, so a non-finite loss never lands in one; before validation; at the end of training).
Every rank reads the same all-reduced value at the same places, so all stop together on a non-finite loss.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


class LogWindow:
    """Loss and throughput since the last log line: summed on the device, read once per log interval."""

    def __init__(self, device: torch.device) -> None:
        self.loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        self.micro = 0  # micro-batch losses in loss_sum
        self.samples = 0  # samples of all ranks since t0
        self.t0 = time.perf_counter()

    def add(self, loss: torch.Tensor, samples: int) -> None:
        """One micro-batch's loss (no host sync) and its samples over all ranks."""
        self.loss_sum += loss.detach().double()
        self.micro += 1
        self.samples += samples

    def restart(self, now: float) -> None:
        """Throughput counts from `now` (perf_counter seconds)."""
        self.t0, self.samples = now, 0


class NonFiniteLoss(FloatingPointError):
    """The all-reduced mean loss of a log interval is NaN or infinite (every rank raises it at the same place)."""

    def __init__(self, value: float, step: int) -> None:
        super().__init__(f"loss is {value} at step {step}")
        self.step = step


@dataclass
class PendingLine:
    """A log step's figures, its loss sum on its way to the host."""

    step: int
    loss_host: torch.Tensor  # the all-reduced loss sum, pinned host memory (filled when `done` has passed)
    done: torch.cuda.Event | None  # recorded after the copy (None: a CPU rank, copied already)
    losses: int  # micro-batch losses summed over all ranks
    samples_per_s: float
    wall_time: float  # time.time() when the step was queued: the metrics record's time
    values: dict[str, Any] = field(default_factory=dict)  # the rest of the record, as it was at the step

    def mean_loss(self) -> float:
        """The interval's mean loss (waits for the copy, long finished when read at the next log step)."""
        if self.done is not None:
            self.done.synchronize()
        return self.loss_host.item() / self.losses


def queue_line(win: LogWindow, step: int, world_size: int, reduce: Callable[[torch.Tensor], Any], now: float,
               values: dict[str, Any]) -> PendingLine:
    """Queue the all-reduce of `win`'s loss sum and its copy to the host; restart the window at `now`.

    `values`: the record's other figures as they are at this step (LR, epoch, memory). `reduce` sums a tensor
    over ranks in place (World.all_reduce_sum). The window's sum is cleared after the copy on the same stream,
    so the next interval starts from zero without waiting for it.
    """
    reduce(win.loss_sum)
    cuda = win.loss_sum.is_cuda
    host = torch.empty((), dtype=torch.float64, pin_memory=cuda)
    host.copy_(win.loss_sum, non_blocking=cuda)
    done = None
    if cuda:
        done = torch.cuda.Event()
        done.record()
    line = PendingLine(step, host, done, win.micro * world_size, win.samples / max(now - win.t0, 1e-9), time.time(),
                       values)
    win.loss_sum.zero_()
    win.micro = 0
    win.restart(now)
    return line


def check_finite(value: float, step: int) -> None:
    """Raise NonFiniteLoss for a NaN or infinite mean loss."""
    if not math.isfinite(value):
        raise NonFiniteLoss(value, step)
