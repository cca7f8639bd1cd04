"""The quickstart guide (docs/guides/quickstart.md), run as written: make its three colour classes, train on the
image folder, export .pt, load it into torchvision; the run holds its stated floor (tests/recipes/floors.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recipes.floors import FLOORS

REPO = Path(__file__).resolve().parents[2]


def guide_block(marker: str) -> str:
    """The bash block that follows `<!-- marker -->` in the quickstart guide."""
    text = (REPO / "docs" / "guides" / "quickstart.md").read_text(encoding="utf-8")
    m = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)\n```", text, re.S)
    assert m, f"docs/guides/quickstart.md lost its {marker} block"
    return m.group(1)


def quickstart_script() -> str:
    """The guide's data block, then its training block: what a reader without images runs."""
    return guide_block("quickstart-data") + "\n" + guide_block("quickstart")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `musubi` and `python` as a newcomer's activated venv has them (this checkout first on the path).
    (bin_dir / "musubi").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m musubi.cli "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
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
