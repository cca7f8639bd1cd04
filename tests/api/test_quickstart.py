"""The quickstart guide (docs/guides/quickstart.md), run as written: make its three colour classes, train on the
image folder, export .pt, load it into torchvision; the run holds its stated floor (tests/recipes/floors.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench.recipes import newcomer_env, quickstart_script
from tests.recipes.floors import FLOORS

REPO = Path(__file__).resolve().parents[2]
#: The quickstart's console on 2 CPU ranks (data block, training, export, the load into torchvision): 24 lines.
QUICKSTART_LINES = 25


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    env = newcomer_env(tmp_path)
    log = tmp_path / "quickstart.log"
    with open(log, "w") as out:  # a file, not a pipe: no process left holding it can stall the test
        code = subprocess.run(["bash", "-euo", "pipefail", "-c", quickstart_script()], cwd=tmp_path, env=env,
                              stdout=out, stderr=subprocess.STDOUT, timeout=560).returncode
    text = log.read_text()
    assert code == 0, text[-4000:]
    m = re.search(r"classes: \['blue', 'green', 'red'\] top1: ([\d.]+)", text)
    assert m, text[-4000:]
    floor = FLOORS["quickstart"]
    assert float(m.group(1)) >= floor.floor, f"quickstart top1 {m.group(1)} < its floor {floor.floor}: {text[-3000:]}"
    assert (tmp_path / "runs" / "my-images" / "my-images" / "export" / "model.pt").is_file()
    # the LR is the one written (no base_batch): no rule line, and the ranks say so
    assert "lr 0.05 (lr_rule none" in (tmp_path / "runs" / "my-images" / "my-images" / "logs" / "rank0.log").read_text()
    # a console short enough to read (91 lines before issue 45, 61 of them the checklist's table): the checklist's
    # summary, every failing or warning item in full, the table in its file; no warning of Musubi's own defaults
    lines = text.splitlines()
    assert len(lines) <= QUICKSTART_LINES, f"{len(lines)} console lines (at most {QUICKSTART_LINES}):\n{text}"
    checklist = json.loads((tmp_path / "runs" / "my-images" / "checklist.json").read_text())
    for item in checklist["items"]:
        if item["status"] in ("FAIL", "WARN"):
            assert f"{item['status']} " in text and item["found"] in text, (item, text)
    assert "full checklist: runs/my-images/checklist.json" in text and "run checklist" not in text
    assert "oversubscribe" not in text and "GPU" not in text  # defaults fit the 2 CPU ranks; words fit the machine
