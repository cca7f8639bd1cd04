"""The quickstart guide (docs/guides/quickstart.md), run as written: train on an image folder, export .pt, load it into torchvision."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def quickstart_script() -> str:
    """The bash block that follows `<!-- quickstart -->` in the quickstart guide."""
    text = (REPO / "docs" / "guides" / "quickstart.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- quickstart -->\n```bash\n(.*?)\n```", text, re.S)
    assert m, "docs/guides/quickstart.md lost its quickstart block"
    return m.group(1)


def _images(root: Path, per_class: int) -> None:
    """Two classes a net tells apart in a few steps: dark and bright squares with a little noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls, level in (("cats", 40), ("dogs", 210)):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            px = np.clip(level + rng.normal(0, 20, (40, 40, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(px).save(root / cls / f"{i}.png")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    _images(tmp_path / "data" / "train", 16)
    _images(tmp_path / "data" / "val", 4)
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
    assert "classes: ['cats', 'dogs'] top1:" in text
    assert (tmp_path / "runs" / "my-images" / "my-images" / "export" / "model.pt").is_file()
