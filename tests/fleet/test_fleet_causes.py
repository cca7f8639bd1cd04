"""Failure causes of external jobs from their own log (oom, nccl), the eval.json contract, and log tails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from musubi.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOB = '''
import os, pathlib, sys
d = pathlib.Path(os.environ["MUSUBI_JOB_DIR"])
runs = d / "runs"
runs.write_text(str(int(runs.read_text()) + 1) if runs.exists() else "1")
if sys.argv[1] == "oom":
    print("step 3 loss 1.2")
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")
    sys.exit(1)
if sys.argv[1] == "nccl":
    print("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error")
    sys.exit(1)
if sys.argv[1] == "badcsv":  # a results.csv of another task: its evaluation refuses it, the same way every time
    (d / "results.csv").write_text("epoch,time,train/box_loss\\n1,2.0,1.5\\n")
    sys.exit(0)
if sys.argv[1] == "twice":  # a long first failure, then a short second one of another kind
    if runs.read_text() == "1":
        for i in range(20):
            print(f"first attempt line {i}")
        sys.exit(3)
    print("second attempt fails differently")
    sys.exit(4)
print("trained; forgot eval.json")  # exits 0 without writing $MUSUBI_JOB_DIR/eval.json
'''


def test_external_causes_from_the_log_and_a_broken_contract_is_not_retrained(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "causes", "jobs": [
        {"name": "oomer", "command": ["job.py", "oom"], "retries": 0},
        {"name": "nccl", "command": ["job.py", "nccl"], "retries": 0},
        {"name": "noeval", "command": ["job.py", "noeval"], "retries": 1},
        {"name": "badcsv", "command": ["job.py", "badcsv"], "retries": 1, "metrics_from": "ultralytics"},
        {"name": "twice", "command": ["job.py", "twice"], "retries": 1}]}))
    out = tmp_path / "run"
    # In this process (CliRunner), as tests/fleet/test_fleet_run.py: the jobs and their evaluation steps are real
    # processes all the same, and a `musubi run` of its own would import torch again (~5 s of CPU) for nothing
    # this test asserts.
    res = CliRunner().invoke(app, ["run", str(fleet), "--out", str(out), "--device", "cpu", "--cpu-slots", "2",
                                   "--no-check"])
    assert res.exit_code == 1, res.output
    jobs = json.loads((out / "fleet.json").read_text())["jobs"]
    assert jobs["oomer"]["causes"][0].startswith("oom: torch.OutOfMemoryError: CUDA out of memory")
    assert jobs["nccl"]["causes"][0].startswith("nccl: torch.distributed.DistBackendError: NCCL error")
    contract = f"contract: external job wrote no eval.json to $MUSUBI_JOB_DIR ({out / 'noeval'})"
    # exit 0 without eval.json is the same every time: failed at once, not retried (nor retrained)
    assert jobs["noeval"]["causes"] == [contract], jobs["noeval"]
    assert jobs["noeval"]["attempts"] == 1 and (out / "noeval" / "runs").read_text() == "1"
    # the failure's log tail names the log
    # the failure's log tail names the log: on the console and in RUN/fleet.log
    head = f"--- last 3 lines of {out / 'oomer' / 'logs' / 'stdout.log'} ---"
    assert head in res.output, res.output
    assert head in (out / "fleet.log").read_text()
    # an evaluation that refuses the job's files carries its reason, and is not retried: they would fail again
    bad = jobs["badcsv"]
    assert bad["attempts"] == 1 and len(bad["causes"]) == 1, bad
    assert bad["causes"][0].startswith(f"evaluation: {out / 'badcsv' / 'results.csv'}: no column metrics/"), bad
    rows = {r["job"]: r for r in json.loads((out / "leaderboard.json").read_text())["rows"]}
    assert rows["badcsv"]["reason"] == f"failed: {bad['causes'][0]}", rows["badcsv"]
    # a retry's tail holds its own attempt only
    assert jobs["twice"]["causes"] == ["exit 3", "exit 4"], jobs["twice"]
    second = f"--- last 2 lines of {out / 'twice' / 'logs' / 'stdout.log'} ---"
    tail = (out / "fleet.log").read_text().split(second, 1)[1].split("---", 1)[0]
    assert "second attempt fails differently" in tail and "first attempt" not in tail, tail
