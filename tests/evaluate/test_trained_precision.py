"""The precision a job ended in (after numerical fallbacks) reaches fleet.json's state and the leaderboard."""

from __future__ import annotations

import json
from pathlib import Path

from musubi.evaluate.leaderboard import build_leaderboard
from musubi.fleet.jobs import absorb_job_record
from musubi.fleet.local import JobState
from musubi.recovery.numerics import trained_precision


def _job(run: Path, name: str, asked: str, final: str, fallbacks: list[dict]) -> Path:
    job = run / name
    (job / "numerics").mkdir(parents=True)
    config = {"name": name, "task": "detection", "model": "m", "train": {"precision": asked}}
    (job / "job.json").write_text(json.dumps({"config": config, "status": "done", "history": []}))
    (job / "summary.json").write_text(json.dumps({"precision": final, "steps": 10}))
    (job / "numerics" / "applied.json").write_text(json.dumps(fallbacks))
    record = {"metrics": {"map50": 0.5}, "primary_metric": "map50", "fps": {"fps": 10.0},
              "precision": trained_precision(job)}
    (job / "eval.json").write_text(json.dumps(record))
    return job


def test_final_precision_in_fleet_state_and_leaderboard(tmp_path: Path) -> None:
    run = tmp_path / "run"
    unstable = _job(run, "detr", "auto", "fp32", [{"step": 40, "last_good_step": 30, "from": "bf16", "to": "fp32",
                                                   "quarantined": []}])
    _job(run, "cnn", "auto", "bf16", [])
    st = JobState("detr", "task")
    absorb_job_record(st, unstable, failed=False)
    assert st.precision == "fp32"
    rows = {r["job"]: r for r in build_leaderboard(run, history=False)}
    assert (rows["detr"]["precision"], rows["cnn"]["precision"]) == ("fp32", "bf16")
    assert trained_precision(unstable)["fallbacks"] == [{"step": 40, "from": "bf16", "to": "fp32"}]


def test_no_precision_before_training(tmp_path: Path) -> None:
    assert trained_precision(tmp_path) is None
