"""A refactor keeps recorded losses identical: a tiny deterministic 2-rank job against committed figures.

tests/worker/expected_losses.json was recorded before the trainer's step was split into
forward_backward / optimizer_step (torch 2.14, CPU, gloo); the step's losses must not move.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.runs import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EXPECTED = Path(__file__).with_name("expected_losses.json")


def test_recorded_losses_are_unchanged(tiny_job, tmp_path: Path) -> None:
    job = tiny_job(train={"deterministic": True, "epochs": 2, "log_every": 1}, data={"workers": 1},
                   checkpoint={"every_steps": 5, "keep_best": 1})
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "r"))
    assert code == 0, out
    records = [json.loads(ln) for ln in (tmp_path / "r" / "tiny" / "metrics.jsonl").read_text().splitlines()]
    losses = [[r["step"], r["loss"]] for r in records if r["kind"] == "train"]
    assert losses == json.loads(EXPECTED.read_text())
