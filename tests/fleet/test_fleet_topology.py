"""A fleet placed by a recorded topology (CPU slots standing for its GPUs): decisions and reasons in fleet.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from musubi.cli import app

from ..topology.recorded import FIXTURES, PAIRS8

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXTERNAL = '''
import json, os, pathlib
if os.environ.get("RANK", "0") == "0":
    d = pathlib.Path(os.environ["MUSUBI_JOB_DIR"])
    (d / "eval.json").write_text(json.dumps({"metrics": {"top1": 0.5}, "primary_metric": "top1"}))
'''


def test_single_gpu_job_leaves_the_nvlink_pair_to_the_two_gpu_job(tmp_path: Path) -> None:
    (tmp_path / "ext.py").write_text(EXTERNAL)
    data = {"name": "berth", "machine": {"topology": str(FIXTURES / PAIRS8)},
            "leaderboard": {"export_top": 0},
            "jobs": [{"name": "solo", "command": ["ext.py"], "priority": 5},
                     {"name": "duo", "command": ["ext.py"], "gpus": 2, "launch": "torchrun"}]}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(tmp_path / "fleet.yaml"), "--out", str(out), "--device", "cpu",
                                   "--cpu-slots", "3", "--no-check"])
    assert res.exit_code == 0, res.output
    jobs = json.loads((out / "fleet.json").read_text())["jobs"]
    # slots 0,1 are an NVLink pair (NV4) in the recorded machine, 2 is half of the next pair
    assert jobs["solo"]["gpus"] == [2] and jobs["duo"]["gpus"] == [0, 1]
    assert "leaves 0,1 (NV4 (4 NVLinks)) for queued duo" in jobs["solo"]["placement"]
    assert jobs["duo"]["placement"] == "all free GPUs; worst link NV4 (4 NVLinks)"
