"""The report's per-rank plots show steady state: warm-up steps on a scale of their own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.diagnose import figures
from musubi.diagnose.timeline import load_job
from musubi.telemetry.straggler import WARMUP
from tests.diagnose.records import write_job

pytest.importorskip("matplotlib")

AUTOTUNE_MS = 8000.0  # the first step of a GPU run: cudnn autotuning (8 s measured on resnet50, 4x H200)


def _with_slow_first_step(job: Path) -> Path:
    for f in (job / "telemetry").glob("rank*.jsonl"):
        recs = [json.loads(ln) for ln in f.read_text(encoding="utf-8").splitlines()]
        for r in recs:
            if r.get("step") == 1:
                r["gpu"]["forward"] += AUTOTUNE_MS
                r["gpu_wall_ms"] += AUTOTUNE_MS
        f.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return job


def test_warmup_is_on_its_own_scale_and_steady_steps_fill_theirs(tmp_path: Path) -> None:
    job = _with_slow_first_step(write_job(tmp_path / "job", ranks=2, steps=60, slow_rank=1, factor=1.1, gpu=True))
    fig = figures.draw_local_work(load_job(job))
    warm, steady = fig.axes
    warm_x = {x for line in warm.get_lines() for x in line.get_xdata()}
    steady_x = {x for line in steady.get_lines() for x in line.get_xdata()}
    assert warm_x == set(range(1, WARMUP + 1)) and steady_x == set(range(WARMUP + 1, 61))
    assert warm.get_ylim()[1] > AUTOTUNE_MS
    # Steady work is ~35 ms (slow rank ~38): its axis is scaled to it, not to the 8 s step.
    assert 35 < steady.get_ylim()[1] < 100
    assert figures.local_work(load_job(job)).startswith("<svg")


def test_a_window_past_warmup_has_one_panel(tmp_path: Path) -> None:
    job = _with_slow_first_step(write_job(tmp_path / "job", ranks=2, steps=60, gpu=True))
    fig = figures.draw_local_work(load_job(job).window(20, 60))
    (ax,) = fig.axes
    assert 30 < ax.get_ylim()[1] < 100


def test_steady_scale_says_what_it_leaves_out() -> None:
    assert figures.steady_top([]) is None
    assert figures.steady_top([10.0] * 99 + [5000.0]) == pytest.approx(15.0)  # one stray step of 100 is cut
    assert figures.steady_top([10.0, 20.0]) == pytest.approx(30.0)


def test_a_run_without_validation_says_so_instead_of_empty_axes() -> None:
    """The gpu_hog report of 2026-11-26 (4x H200) drew an empty 'Validation metrics' panel."""
    train = [{"kind": "train", "step": k, "loss": 2.0 / k} for k in range(1, 9)]
    assert "no validation metric in this run" in figures.curves(train)
    val = [{"kind": "val", "step": 8, "top1": 0.5}]
    assert "no validation metric in this run" not in figures.curves(train + val)


def test_a_detectors_loss_parts_get_a_panel_of_their_own() -> None:
    """A detection job's metrics.jsonl has loss_<part> beside the total: the curves plot each part."""
    parts = {"loss_classifier": 0.6, "loss_box_reg": 0.3, "loss_objectness": 0.05, "loss_rpn_box_reg": 0.02}
    recs = [{"kind": "train", "step": k, "loss": 1.0 / k, "lr": 0.01, "samples_per_s": 4.0,
             **{n: v / k for n, v in parts.items()}} for k in range(1, 9)]
    recs.append({"kind": "val", "step": 8, "map50": 0.4, "map": 0.2, "eval_s": 0.3})
    assert figures.loss_part_names(recs) == list(parts)
    fig = figures.draw_curves(recs)
    left, middle, right = fig.axes
    assert [ln.get_label() for ln in middle.get_lines()] == list(parts)
    assert list(middle.get_lines()[1].get_ydata()) == [0.3 / k for k in range(1, 9)]
    assert [ln.get_label() for ln in left.get_lines()] == ["train loss (rank 0)"]
    assert [ln.get_label() for ln in right.get_lines()] == ["val map50", "val map"]
    svg = figures.curves(recs)
    assert all(n in svg for n in parts)  # the legend's text (drawn as paths, named in the SVG's comments)
    # Without parts (a classifier): two panels, as before.
    assert len(figures.draw_curves([{k: v for k, v in r.items() if k not in parts} for r in recs]).axes) == 2
