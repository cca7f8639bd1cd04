"""Numerical guard: an injected NaN on one rank rolls the whole job back to its last good checkpoint,
and it finishes in fp32, with every rank handling it the same way; a NaN in fp32 is retried once in fp32,
and ends the job only when it comes back at the same step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.contract.run_files import RUN_FILES
from musubi.recovery.numerics import ends_job, numerics_dir, safer_precision, trained_precision
from tests.support.runs import train

pytestmark = pytest.mark.timeout(400)


def test_safer_precision_steps() -> None:
    assert safer_precision("fp16", True) == "bf16" and safer_precision("fp16", False) == "fp32"
    assert safer_precision("bf16", True) == "fp32" and safer_precision("fp32", True) is None


def test_fp32_retries_once_per_step(tmp_path: Path) -> None:
    assert not ends_job(tmp_path, 8, "bf16") and not ends_job(tmp_path, 8, "fp32")  # no rollback yet: retry

    def applied(*entries: dict) -> None:
        numerics_dir(tmp_path).mkdir(parents=True, exist_ok=True)
        (numerics_dir(tmp_path) / RUN_FILES.applied).write_text(json.dumps(list(entries)))

    applied({"step": 8, "from": "bf16", "to": "fp32", "last_good_step": 4})
    assert ends_job(tmp_path, 8, "fp32")  # fp32 already ran from the fault of step 8: it came back
    assert not ends_job(tmp_path, 16, "fp32")  # another step: a fault of its own, retried
    assert not ends_job(tmp_path, 8, "bf16")  # something safer exists
    applied({"step": 8, "from": "bf16", "to": "fp32"}, {"step": 16, "from": "fp32", "to": "fp32"})
    assert ends_job(tmp_path, 16, "fp32") and not ends_job(tmp_path, 8, "fp32")  # the newest rollback counts


def test_injected_nan_rolls_back_and_finishes_in_fp32(tiny_job, tmp_path: Path, monkeypatch) -> None:
    # 16 steps per epoch x 2; logs every 4 steps, checkpoints every 3: the NaN of step 5 is seen at the
    # step-8 log; the step-6 checkpoint (taken after the NaN) must never be loaded. A second NaN, in fp32 (step
    # 13, seen at step 16), is retried in fp32 from the step-12 checkpoint; step 15's is quarantined.
    job = tiny_job(train={"precision": "bf16", "max_restarts": 2},
                   checkpoint={"every_steps": 3, "keep_last": 5, "async_mode": "off"})  # deterministic commits
    monkeypatch.setenv("MUSUBI_INJECT", "nan:rank=1,step=5; nan:rank=0,step=13")
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "run"), "--no-check")
    assert code == 0, out
    job_dir = tmp_path / "run" / "tiny"
    applied = json.loads((job_dir / "numerics" / "applied.json").read_text())
    assert len(applied) == 2
    fb, retry = applied
    assert (fb["from"], fb["to"], fb["step"], fb["last_good_step"]) == ("bf16", "fp32", 8, 4)
    assert fb["quarantined"] == ["step-000000006"]
    assert (job_dir / "checkpoints" / "quarantine" / "step-000000006").is_dir()
    assert (retry["from"], retry["to"], retry["step"], retry["last_good_step"]) == ("fp32", "fp32", 16, 12)
    assert retry["quarantined"] == ["step-000000015"]
    assert not list((job_dir / "numerics").glob("nonfinite-rank*.json"))  # applied, then cleared
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["precision"] == "fp32" and summary["steps"] == summary["total_steps"]
    # What eval.json, fleet.json, the leaderboard and the manifest record: asked bf16, ended in fp32.
    assert trained_precision(job_dir) == {"requested": "bf16", "final": "fp32",
                                          "fallbacks": [{"step": 8, "from": "bf16", "to": "fp32"},
                                                        {"step": 16, "from": "fp32", "to": "fp32"}]}
    # both ranks stopped on the same step with the same cause
    errors = [json.loads((job_dir / "logs" / f"error-rank{r}.txt").read_text()) for r in (0, 1)] \
        if (job_dir / "logs" / "error-rank1.txt").exists() else None
    logs = [(job_dir / "logs" / f"rank{r}.log").read_text() for r in (0, 1)]
    assert all("loss is nan at step 8 in bf16" in text for text in logs), errors
    assert all("loss is nan at step 16 in fp32" in text for text in logs), errors
    assert "continuing in fp32 (a retry" in logs[0]
    cl = json.loads((tmp_path / "run" / "checklist.json").read_text())
    item = next(i for i in cl["items"] if i["check"] == "numerics")
    assert item["status"] == "WARN" and "bf16 -> fp32 after a non-finite loss at step 8" in item["found"]
    assert "fp32 -> fp32 after a non-finite loss at step 16" in item["found"]
    records = [json.loads(ln) for ln in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in records if r.get("kind") == "train")  # the NaN era was discarded
