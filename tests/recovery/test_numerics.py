"""Numerical guard: an injected NaN on one rank rolls the whole job back to its last good checkpoint,
and it finishes in fp32, with every rank handling it the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.recovery.numerics import safer_precision, trained_precision
from tests.support.runs import train

pytestmark = pytest.mark.timeout(400)


def test_safer_precision_steps() -> None:
    assert safer_precision("fp16", True) == "bf16" and safer_precision("fp16", False) == "fp32"
    assert safer_precision("bf16", True) == "fp32" and safer_precision("fp32", True) is None


def test_injected_nan_rolls_back_and_finishes_in_fp32(tiny_job, tmp_path: Path, monkeypatch) -> None:
    # 16 steps per epoch x 2; logs every 4 steps, checkpoints every 3: the NaN of step 5 is seen at the
    # step-8 log; the step-6 checkpoint (taken after the NaN) must never be loaded.
    job = tiny_job(train={"precision": "bf16", "max_restarts": 2},
                   checkpoint={"every_steps": 3, "keep_last": 5, "async_mode": "off"})  # deterministic commits
    monkeypatch.setenv("MUSUBI_INJECT", "nan:rank=1,step=5")
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "run"), "--no-check")
    assert code == 0, out
    job_dir = tmp_path / "run" / "tiny"
    applied = json.loads((job_dir / "numerics" / "applied.json").read_text())
    assert len(applied) == 1
    fb = applied[0]
    assert (fb["from"], fb["to"], fb["step"], fb["last_good_step"]) == ("bf16", "fp32", 8, 4)
    assert fb["quarantined"] == ["step-000000006"]
    assert (job_dir / "checkpoints" / "quarantine" / "step-000000006").is_dir()
    assert not list((job_dir / "numerics").glob("nonfinite-rank*.json"))  # applied, then cleared
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["precision"] == "fp32" and summary["steps"] == summary["total_steps"]
    # What eval.json, fleet.json, the leaderboard and the manifest record: asked bf16, ended in fp32.
    assert trained_precision(job_dir) == {"requested": "bf16", "final": "fp32",
                                          "fallbacks": [{"step": 8, "from": "bf16", "to": "fp32"}]}
    # both ranks stopped on the same step with the same cause
    errors = [json.loads((job_dir / "logs" / f"error-rank{r}.txt").read_text()) for r in (0, 1)] \
        if (job_dir / "logs" / "error-rank1.txt").exists() else None
    logs = [(job_dir / "logs" / f"rank{r}.log").read_text() for r in (0, 1)]
    assert all("loss is nan at step 8 in bf16" in text for text in logs), errors
    cl = json.loads((tmp_path / "run" / "checklist.json").read_text())
    item = next(i for i in cl["items"] if i["check"] == "numerics")
    assert item["status"] == "WARN" and "bf16 -> fp32 after a non-finite loss at step 8" in item["found"]
    records = [json.loads(ln) for ln in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in records if r.get("kind") == "train")  # the NaN era was discarded
