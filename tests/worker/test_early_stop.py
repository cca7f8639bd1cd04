"""train.early_stop: the patience rule, and real 2-rank gloo runs that stop early, agree, and resume their count."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from musubi.config.job import EarlyStopSpec
from musubi.worker.early_stop import EarlyStop
from tests.conftest import write_tiny_job
from tests.support.runs import committed_steps, train

STEPS_PER_EPOCH = 8  # the tiny job: 128 samples / (8 per rank x 2 ranks)
EPOCHS = 12
PATIENCE, MIN_DELTA = 2, 0.02


def test_patience_counts_validations_without_a_large_enough_gain() -> None:
    early = EarlyStop.from_spec(EarlyStopSpec(patience=2, min_delta=0.01), "top1")
    assert (early.metric, early.mode) == ("top1", "max")
    assert not early.observe(0.50, 10) and early.best_step == 10  # the first value is the best so far
    assert not early.observe(0.505, 20) and early.bad == 1  # a gain within min_delta is no improvement
    assert not early.observe(0.60, 30) and early.bad == 0 and early.best == 0.60
    assert not early.observe(math.nan, 40) and early.bad == 1  # NaN never improves
    assert early.observe(0.59, 50) and early.bad == 2
    assert "top1 has not improved by more than 0.01 (max) for 2 validation(s) (patience 2); best 0.6 at step 30" \
        == early.reason()
    loss = EarlyStop.from_spec(EarlyStopSpec(patience=1, metric="val_loss"), "top1")
    assert loss.mode == "min" and not loss.observe(2.0, 1) and not loss.observe(1.5, 2) and loss.observe(1.6, 3)
    # a checkpoint's count continues only for the same metric and direction
    fresh = EarlyStop.from_spec(EarlyStopSpec(patience=2, min_delta=0.01), "top1")
    assert fresh.load_state_dict(json.loads(json.dumps(early.state_dict()))) and fresh.bad == 2 and fresh.best == 0.6
    assert not loss.load_state_dict(early.state_dict())


def expected_stop(vals: list[tuple[int, float]]) -> tuple[int, int, float] | None:
    """(stop step, best step, best value) by the rule, from the validation record; None: it never stops."""
    best, best_step, bad = None, -1, 0
    for step, v in vals:
        if best is None or v - best > MIN_DELTA:
            best, best_step, bad = v, step, 0
        else:
            bad += 1
        if bad >= PATIENCE and step < EPOCHS * STEPS_PER_EPOCH:
            return step, best_step, best
    return None


def records(job_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run that stops early uninterrupted; the same job stopped by --max-steps after a validation without
    improvement, then resumed. Three launches shared by the tests below."""
    tmp = tmp_path_factory.mktemp("early")
    job = write_tiny_job(tmp, train={"epochs": EPOCHS, "log_every": 5, "deterministic": True,
                                     "early_stop": {"patience": PATIENCE, "min_delta": MIN_DELTA}},
                         checkpoint={"keep_last": 1})
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp / "whole"))
    assert code == 0, out[-3000:]
    whole = tmp / "whole" / "tiny"
    summary = json.loads((whole / "summary.json").read_text())
    stop = summary["early_stop"]["stopped_step"]
    assert stop is not None and stop % STEPS_PER_EPOCH == 0, summary
    # --max-steps inside the epoch whose validation ran out of patience: the checkpoint there holds a count of
    # PATIENCE - 1 validations without improvement
    cut = stop - STEPS_PER_EPOCH // 2
    code, cut_out = train(str(job), "--nproc", "2", "--out", str(tmp / "cut"), "--max-steps", str(cut))
    assert code == 0, cut_out[-3000:]
    cut_summary = json.loads((tmp / "cut" / "tiny" / "summary.json").read_text())
    code, resumed_out = train(str(job), "--nproc", "2", "--out", str(tmp / "cut"), "--resume")
    assert code == 0, resumed_out[-3000:]
    resumed = tmp / "cut" / "tiny"
    resumed_summary = json.loads((resumed / "summary.json").read_text())
    # A restart from the stop's own checkpoint (as torchrun's after a rank died at exit): nothing left to train.
    record = json.loads((resumed / "job.json").read_text())
    (resumed / "job.json").write_text(json.dumps({**record, "status": "stopped"}))
    code, again_out = train(str(job), "--nproc", "2", "--out", str(tmp / "cut"), "--resume")
    assert code == 0, again_out[-3000:]
    return {"whole": whole, "summary": summary, "stop": stop, "cut": cut, "cut_summary": cut_summary,
            "resumed": resumed, "resumed_summary": resumed_summary,
            "again_summary": json.loads((resumed / "summary.json").read_text())}


@pytest.mark.slow
@pytest.mark.timeout(900)  # the module's 4 launches (3-7 min on a busy 2-core machine) run in the first
def test_a_run_stops_where_its_metric_ran_out_of_patience(runs: dict[str, Any]) -> None:
    whole, summary, stop = runs["whole"], runs["summary"], runs["stop"]
    vals = [(r["step"], r["acc"]) for r in records(whole, "val")]
    assert expected_stop(vals) == (stop, summary["early_stop"]["best_step"], summary["early_stop"]["best"]), vals
    assert vals[-1][0] == stop and stop < EPOCHS * STEPS_PER_EPOCH  # ended with the stop step's validation
    assert summary["finished"] is True and summary["steps"] == stop and summary["total_steps"] == 96
    assert summary["early_stop"]["bad"] == PATIENCE
    # rank 0 says why (its console and log); both ranks took the decision, none waited for the other
    line = f"early stop at step {stop} of 96 (epoch {stop // STEPS_PER_EPOCH}): acc has not improved by more than " \
           f"0.02 (max) for 2 validation(s) (patience 2); best"
    for rank in (0, 1):
        assert line in (whole / "logs" / f"rank{rank}.log").read_text()
    record = json.loads((whole / "job.json").read_text())
    assert record["status"] == "done" and record["history"][-1]["early_stop"]["stopped_step"] == stop
    assert json.loads((whole / "eval.json").read_text())["step"] == stop
    # the train line of the interval the stop cut short (log_every 5 does not divide the stop step)
    assert stop % 5 and records(whole, "train")[-1]["step"] == stop
    # keep_last 1, and the best checkpoint kept beside it (early_stop turned keep_best on)
    best_step = summary["early_stop"]["best_step"]
    assert set(committed_steps(whole)) == {best_step, stop}, committed_steps(whole)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the module's 4 launches (3-7 min on a busy 2-core machine) run in the first
def test_a_resumed_run_keeps_its_patience_count(runs: dict[str, Any]) -> None:
    cut, stop = runs["cut"], runs["stop"]
    assert runs["cut_summary"]["finished"] is False and runs["cut_summary"]["early_stop"]["bad"] == PATIENCE - 1
    resumed = runs["resumed"]
    assert f"resumed from step-{cut:09d}" in (resumed / "logs" / "rank0.log").read_text()
    summary = runs["resumed_summary"]
    # the same stop, best and count as the run that never stopped (a fresh count would go on for PATIENCE more)
    assert summary["early_stop"] == runs["summary"]["early_stop"] and summary["steps"] == stop
    assert f"early stop at step {stop} of 96" in (resumed / "logs" / "rank1.log").read_text()
    assert json.loads((resumed / "job.json").read_text())["status"] == "done"


@pytest.mark.slow
@pytest.mark.timeout(900)  # the module's 4 launches (3-7 min on a busy 2-core machine) run in the first
def test_a_restart_from_the_stops_checkpoint_trains_no_further(runs: dict[str, Any]) -> None:
    stop, resumed, again = runs["stop"], runs["resumed"], runs["again_summary"]
    assert f"resumed from step-{stop:09d}" in (resumed / "logs" / "rank0.log").read_text()
    assert again["steps"] == stop and again["finished"] is True
    assert again["early_stop"] == runs["summary"]["early_stop"] and again["val"] == runs["resumed_summary"]["val"]
    assert max(r["step"] for r in records(resumed, "train")) == stop
