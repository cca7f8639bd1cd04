"""A venv with Ultralytics for the tests of external Ultralytics jobs (never imported by Musubi).

Built on first use with pip from the configured package index (one pinned release) under ~/.cache/musubi (or
$MUSUBI_ULTRALYTICS_VENV), and kept: later runs, and later checkouts on the machine, find it ready. Not inside
the repository: Ultralytics puts its `runs/` at the root of the git repository its own package lies in, which
would take the job's results out of the job's folder. It reaches this venv's packages (torch, numpy, onnx, ...) through a .pth file placed after its own
site-packages, so pip adds only what Ultralytics needs beyond them (opencv, polars, ...: ~15 s on the 2-core
machine) instead of a second torch. Skipped, with the reason, only when the index has no such release.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

VENV = Path(os.environ.get("MUSUBI_ULTRALYTICS_VENV") or Path.home() / ".cache" / "musubi" / "venv-ultralytics")
#: The release the tests train with (its fitness rule is mAP50-95 alone; evaluate/adapters.py FITNESS_RULES).
ULTRALYTICS = "ultralytics==8.4.190"


def ultralytics_python() -> Path:
    """The venv's interpreter, with ULTRALYTICS installed (built once; a lock keeps parallel workers apart)."""
    python = VENV / "bin" / "python"
    ready = VENV / ".musubi-ready"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / f"{VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.is_file() and ready.read_text() == ULTRALYTICS and python.exists():
            # The venv was built beside another checkout's venv, perhaps one deleted since (its .pth then led
            # nowhere: no numpy, and every Ultralytics job failed): it reaches this one's packages from now on.
            link_packages(python)
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        link_packages(python)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", ULTRALYTICS], capture_output=True,
                              text=True)
        if done.returncode != 0:
            said = done.stderr + done.stdout
            if "No matching distribution" in said or "Could not find a version" in said:
                pytest.skip(f"the package index offers no {ULTRALYTICS}: the Ultralytics job cannot be trained")
            raise RuntimeError(f"pip install {ULTRALYTICS} into {VENV} failed:\n{said[-3000:]}")
        ready.write_text(ULTRALYTICS, encoding="utf-8")
        return python


def link_packages(python: Path) -> None:
    """Point the venv's .pth at this interpreter's site-packages, after the venv's own (.pth lines are appended
    to sys.path: its own packages win). Written only when it differs, under the caller's lock."""
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    pth, line = Path(site, "zz-musubi-venv.pth"), sysconfig.get_paths()["purelib"] + "\n"
    if not pth.is_file() or pth.read_text(encoding="utf-8") != line:
        pth.write_text(line, encoding="utf-8")
