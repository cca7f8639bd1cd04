"""The commit a bench ran at, for its result files.

The lent GPU machine gets a copy of the working tree whose .git is stale (it names an older HEAD), so a
bench there would record the wrong commit from git: the device call sets MUSUBI_COMMIT, which wins.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def commit() -> str:
    """MUSUBI_COMMIT where set, else git's short HEAD (+dirty with uncommitted changes), else 'unknown'."""
    if os.environ.get("MUSUBI_COMMIT"):
        return os.environ["MUSUBI_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if sha:
            return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"
