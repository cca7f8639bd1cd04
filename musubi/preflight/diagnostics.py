"""Hang diagnostics set for every run: a stuck collective ends the job with a flight-recorder dump.

torch's NCCL watchdog notices a collective that outlives the process-group
timeout (train.timeout_s). These variables make it abort the ranks instead of
waiting forever, and make every rank first write its last collectives (the
NCCL flight recorder) to JOB/logs/, where `musubi report` and people can see
which rank stopped at which collective. User values always win.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from musubi.contract.run_files import RUN_FILES

#: Flight-recorder entries kept per rank (torch's default is 2000; a long step has more collectives).
TRACE_BUFFER_ENTRIES = 20000
#: Prefix of the per-rank dump files in JOB/logs/ (torch appends the rank: nccl-trace-rank3).
DUMP_PREFIX = "nccl-trace-rank"

# Older torch read the variable without the TORCH_ prefix; a user's value under either name wins.
_ALIASES = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "NCCL_ASYNC_ERROR_HANDLING"}


def diagnostic_env(job_dir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables to add to the workers' environment (only those the user has not set; creates JOB/logs/)."""
    base = os.environ if base is None else base
    logs = job_dir / RUN_FILES.logs
    logs.mkdir(parents=True, exist_ok=True)
    wanted = {
        # 3 = abort the rank without ncclCommAbort (which can itself hang on a wedged communicator);
        # torch >= 2.2 defaults to it, set here so an old default or stray config cannot leave a hang.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(TRACE_BUFFER_ENTRIES),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str((logs / DUMP_PREFIX).absolute()),
    }
    return {k: v for k, v in wanted.items() if k not in base and _ALIASES.get(k, k) not in base}
