"""The log line queued at its step and read later (worker/log_window.py), in process on CPU."""

from __future__ import annotations

import math
import time

import pytest
import torch

from musubi.worker.log_window import (
    LogWindow,
    NonFiniteLoss,
    agree_parts,
    check_finite,
    part_fingerprint,
    part_key,
    queue_line,
)

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


def test_loss_parts_ride_in_the_same_reduce_and_average_over_the_micro_batches_that_had_them() -> None:
    """A detector's named parts: summed beside the total, one all-reduce, one copy; a missing part is averaged
    over the micro-batches that had it; a non-scalar part is not a figure."""
    win = LogWindow(torch.device("cpu"))
    win.add(torch.tensor(3.0), 4, {"loss_box": torch.tensor(1.0), "classification": torch.tensor(2.0),
                                   "per_anchor": torch.ones(3)})
    win.add(torch.tensor(5.0), 4, {"loss_box": torch.tensor(3.0), "classification": torch.tensor(2.0)})
    win.add(torch.tensor(4.0), 4, {"classification": 4.0, "unknown_later": torch.tensor(9.0)})
    assert win.part_names == ("loss_box", "classification")
    shapes: list[tuple[int, ...]] = []

    def reduce(t: torch.Tensor) -> torch.Tensor:  # two ranks with the same figures
        shapes.append(tuple(t.shape))
        return t.mul_(2)

    line = queue_line(win, 10, 2, reduce, now=time.perf_counter(), values={})
    assert shapes == [(5,)]  # the total, two sums, two counts: one collective
    assert line.mean_loss() == pytest.approx(24.0 / 6)
    assert line.mean_parts() == pytest.approx({"loss_box": 2.0, "loss_classification": 8.0 / 3})
    assert win.part_sums is not None and win.part_sums.abs().sum().item() == 0.0  # the next interval starts at 0
    # The next interval has had no part yet: none is logged rather than a 0/0.
    win.add(torch.tensor(1.0), 4)
    assert queue_line(win, 20, 2, reduce, now=time.perf_counter(), values={}).mean_parts() == {}


def test_a_loss_of_one_part_is_its_total_and_names_are_fingerprinted() -> None:
    win = LogWindow(torch.device("cpu"))
    win.add(torch.tensor(1.0), 4, {"ce": torch.tensor(1.0)})
    assert win.part_names == () and win.part_sums is None
    line = queue_line(win, 1, 1, lambda t: t, now=time.perf_counter(), values={})
    assert line.loss_host.shape == (1,) and line.mean_parts() == {}
    assert part_fingerprint(None) == part_fingerprint(()) == 0
    assert part_fingerprint(("a", "b")) not in (0, part_fingerprint(("b", "a")), part_fingerprint(("a",)))
    assert part_key("loss_box_reg") == "loss_box_reg" and part_key("bbox_ctrness") == "loss_bbox_ctrness"


def test_ranks_that_sum_other_parts_log_the_total_alone() -> None:
    """The line's all-reduce needs one buffer length on every rank: parts are kept only where all agree."""
    def window(parts: dict[str, torch.Tensor] | None) -> LogWindow:
        win = LogWindow(torch.device("cpu"))
        win.add(torch.tensor(1.0), 1, parts)
        return win

    two = {"a": torch.tensor(0.5), "b": torch.tensor(0.5)}
    same = window(two)
    mine = part_fingerprint(same.part_names)
    assert agree_parts(same, lambda v: min(v, mine), lambda v: max(v, mine)) and same.part_names == ("a", "b")
    other = part_fingerprint(("a", "c"))  # a peer rank summing other parts
    differ = window(two)
    assert not agree_parts(differ, lambda v: min(v, other), lambda v: max(v, other))
    assert differ.part_names == () and differ.part_sums is None
    differ.add(torch.tensor(1.0), 1, two)  # and none later
    assert queue_line(differ, 2, 1, lambda t: t, now=time.perf_counter(), values={}).loss_host.shape == (1,)
    late = window(None)  # no part by the first step: none is summed later (never agreed)
    assert agree_parts(late, lambda v: v, lambda v: v)
    late.add(torch.tensor(1.0), 1, two)
    assert late.part_names == ()
