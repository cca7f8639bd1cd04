"""`--resume` of a real run: a changed job is refused unless allowed, an allowed change is recorded in
job.json, a finished run is reported at once; every start-up phase prints a line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.runs import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_resume_changes_are_refused_allowed_and_recorded(tiny_job, tmp_path: Path) -> None:
    job = tiny_job(train={"epochs": 1})
    run = str(tmp_path / "r")
    code, out = train(str(job), "--nproc", "2", "--out", run, "--max-steps", "4", "--set", "train.lr=0.2")
    assert code == 0, out
    # the first 20 s are never silent: the launcher's phases on the console, the rank's in its log
    assert "preflight: machine, disk and data checks..." in out and "launching 2 CPU ranks (torchrun)" in out
    log0 = (tmp_path / "r" / "tiny" / "logs" / "rank0.log").read_text()
    assert log0.index("building the model, optimizer and data loaders") < log0.index("first step")
    job_json = tmp_path / "r" / "tiny" / "job.json"
    before = job_json.read_bytes()

    code, out = train(str(job), "--nproc", "2", "--out", run, "--resume")  # without the --set
    assert code == 2 and "train.lr 0.2 -> 0.1" in out and "--allow-changes train.lr" in out
    assert job_json.read_bytes() == before

    code, out = train(str(job), "--nproc", "2", "--out", run, "--resume", "--allow-changes", "train.lr")
    assert code == 0, out
    record = json.loads(job_json.read_text())
    assert record["status"] == "done" and record["config"]["train"]["lr"] == 0.1
    assert record["changes"] == [{"attempt": 2, "key": "train.lr", "before": 0.2, "after": 0.1}]

    code, out = train(str(job), "--nproc", "2", "--out", run, "--resume")
    assert code == 0 and "already finished" in out and "launching" not in out, out
    assert json.loads(job_json.read_text())["attempts"] == 2
