"""The demo fleet (`make demo`): its models can learn in a short run, its external program keeps the contract.

The whole demo takes minutes on 2 CPU cores, too long for the suite; these checks guard the two
ways it once ended at mAP50 0.00 (issue 17).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

from musubi.config.fleet import TaskJob
from musubi.config.load import load_fleet
from musubi.evaluate.external import read_external_eval
from musubi.tasks.registry import build_task
from tests.conftest import REPO
from tests.support.pythonpath import repo_on_path

DEMO = REPO / "examples" / "fleet-demo.yaml"


def test_demo_batchnorm_statistics_follow_a_short_run() -> None:
    # Evaluation uses BatchNorm running statistics; at torchvision's SSDlite momentum (0.03) they
    # lag the weights of a 120-step run so far that mAP50 stays ~0 while the loss falls.
    jobs = [j for j in load_fleet(DEMO).jobs if isinstance(j, TaskJob)]
    assert len(jobs) == 3
    for job in jobs:
        norms = [m for m in build_task(job.spec).build_model().modules() if isinstance(m, nn.BatchNorm2d)]
        assert norms and min(m.momentum for m in norms) >= 0.1, job.name


@pytest.mark.slow
def test_demo_external_program_learns_and_writes_its_eval(tmp_path: Path) -> None:
    env = {**os.environ, "MUSUBI_JOB_DIR": str(tmp_path), "PYTHONPATH": repo_on_path(REPO)}
    done = subprocess.run(
        # 8 validation images, not the 32 of the demo: the mAP is only checked to be one (7 s of CPU less)
        [sys.executable, str(REPO / "examples/external/tiny_detector.py"), "--steps", "11", "--batch", "2",
         "--image-size", "96", "--val-images", "8"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    losses = [float(x) for x in re.findall(r"^step \d+ loss ([\d.]+)$", done.stdout, re.M)]
    assert len(losses) == 2 and losses[1] < losses[0], done.stdout
    result = read_external_eval(tmp_path / "eval.json")
    assert result["primary_metric"] == "map50" and 0 <= result["metrics"]["map50"] <= 1
    assert json.loads((tmp_path / "eval.json").read_text())["fps"]["fps"] > 0
