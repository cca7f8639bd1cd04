"""A real single-node Slurm on localhost for the Slurm executor's tests (tests/slurm/start_slurm.sh).

Started once per session. Where it cannot start (not root and Slurm not running, no
apt-get) the tests skip with the reason, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("start_slurm.sh")


@pytest.fixture(scope="session")
def slurm_cluster() -> float:
    """Start (or find) the local Slurm; returns the seconds it took."""
    t0 = time.monotonic()
    try:
        res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900)
        why = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1] if res.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as e:
        why = f"start_slurm.sh: {e}"
    if why:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the Slurm tests but Slurm could not be started: {why}")
        pytest.skip(f"no local Slurm: {why}")
    return time.monotonic() - t0
