"""The commit a bench ran at, for its result files.

The lent GPU machine gets a copy of the working tree whose .git is stale (it names an older HEAD), so a
bench there would record the wrong commit from git: the device call sets MUSUBI_COMMIT, which wins.
Otherwise the git state as `musubi` records a run's provenance (store/provenance.project_git).
"""

from __future__ import annotations

import os
from pathlib import Path

from musubi.store.provenance import project_git

REPO = Path(__file__).resolve().parents[1]


def commit() -> str:
    """MUSUBI_COMMIT where set, else git's short HEAD (+dirty with uncommitted changes), else 'unknown'."""
    if os.environ.get("MUSUBI_COMMIT"):
        return os.environ["MUSUBI_COMMIT"]
    git = project_git(REPO)
    if git is None:
        return "unknown"
    return git["commit"][:7] + ("+dirty" if git["dirty"] else "")
