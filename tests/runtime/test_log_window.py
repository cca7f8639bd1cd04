"""The log line queued at its step and read later (worker/log_window.py), in process on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from musubi.worker.log_window import LogWindow, NonFiniteLoss, check_finite, queue_line

pytestmark = pytest.mark.timeout(60)


def test_a_queued_line_keeps_its_interval_and_the_window_starts_again() -> None:
    win = LogWindow(torch.device("cpu"))
    win.restart(100.0)
    for loss in (1.0, 2.0, 3.0):
        win.add(torch.tensor(loss), samples=8)
    reduced: list[float] = []

    def reduce(t: torch.Tensor) -> torch.Tensor:  # two ranks with the same losses
        reduced.append(t.item())
        return t.mul_(2)

    line = queue_line(win, 30, 2, reduce, now=102.0, values={"lr": 0.1})
    assert reduced == [6.0]
    # the window is empty at once; the line still holds its own sum (a copy, not a view)
    assert (win.loss_sum.item(), win.micro, win.samples, win.t0) == (0.0, 0, 0, 102.0)
    win.add(torch.tensor(50.0), samples=8)
    assert line.mean_loss() == pytest.approx(12.0 / 6)
    assert (line.step, line.losses, line.samples_per_s, line.values) == (30, 6, 12.0, {"lr": 0.1})
    assert line.done is None  # a CPU rank's copy is done when queued


def test_a_non_finite_loss_names_its_step_and_is_a_floating_point_error() -> None:
    check_finite(1.5, 10)
    for bad in (math.nan, math.inf):
        with pytest.raises(FloatingPointError, match="loss is (nan|inf) at step 40") as err:
            check_finite(bad, 40)
        assert isinstance(err.value, NonFiniteLoss) and err.value.step == 40
