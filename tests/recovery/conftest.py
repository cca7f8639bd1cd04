"""The recovery drills' one reference run, shared by every drill of the session (both drill files)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, write_tiny_job

#: The drills' job: checkpoints every 3 steps, a 5 s hang floor. The DCP-process drill differs only in
#: checkpoint.async_mode, which the reference's identity leaves out (it changes how saves are written).
DRILL_JOB: dict[str, Any] = {"checkpoint": {"every_steps": 3, "async_mode": "thread"}, "watchdog": {"floor_s": 5}}


@pytest.fixture(scope="session")
def drill_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished drill reference (DRILL_JOB, 2 CPU ranks), trained once per session: under xdist the first
    worker to ask trains it and the others wait on a lock, then reuse it through `--reference`."""
    from musubi.launch.drill import DrillRequest, train_reference
    from musubi.launch.drill_reference import REFERENCE_FILE

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # one folder for the whole session, shared by its workers
    out = base / "drill-reference"
    with open(base / "drill-reference.lock", "w") as lock, pytest.MonkeyPatch.context() as mp:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (out / "reference" / REFERENCE_FILE).is_file():
            # Session scope runs before the autouse per-test setup: the same CPU world and working directory.
            mp.setenv("MUSUBI_DEVICE", "cpu")
            mp.setenv("CUDA_VISIBLE_DEVICES", "")
            mp.delenv("MUSUBI_INJECT", raising=False)
            mp.chdir(REPO)
            job_dir = base / "drill-reference-job"
            job_dir.mkdir(exist_ok=True)
            train_reference(DrillRequest(job_path=write_tiny_job(job_dir, **DRILL_JOB), faults=[], nproc=2,
                                         device="cpu", out=out))
    return out
