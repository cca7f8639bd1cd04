"""How a rank ends: its exit codes and the error records the launcher, goodput and a restart read.

Every way out of a rank is an exit code the launcher reads (the table: contract/exits.py): 0 done,
1 a crash, 2 bad input (`ConfigError`), EXIT_OOM and EXIT_NUMERICS (recovery/memory.py,
recovery/numerics.py: torchrun restarts every rank with a smaller batch or a safer precision),
EXIT_HANG (recovery/watchdog.py), EXIT_DEFECT (recovery/repeats.py: the same failure twice, not
restarted again). Beside the code, a failed rank writes one line,
`logs/error-rank{r}.txt` (its kind and message, so the launcher prints one line instead of a wall
of tracebacks), and one record per attempt under `logs/exits/` (goodput names each failure's
cause; a cause that repeats at the same line is a defect). No torch here: the entry (worker.py)
refuses a hopeless restart before it imports anything heavy.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG, EXIT_FAILED, FINAL_KINDS
from musubi.contract.records import ErrorLine, ExitRecord
from musubi.contract.run_files import RUN_FILES
from musubi.recovery.repeats import exception_site


class RankEnd(Exception):  # noqa: N818 - an end on purpose, not an error
    """A planned end before training (--probe-only, a repeated failure): the rank exits with `code`."""

    def __init__(self, code: int) -> None:
        super().__init__(f"rank ends with exit code {code}")
        self.code = code


def error_path(job_dir: Path, rank: int) -> Path:
    """This rank's one-line error file (cleared by the next attempt)."""
    return job_dir / RUN_FILES.logs / f"error-rank{rank}.txt"


def write_error(job_dir: Path, rank: int, kind: str, message: str, exc: BaseException | None = None) -> None:
    """Record why this rank fails: its error file, and this attempt's exit record (where `exc` was raised)."""
    path = error_path(job_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ErrorLine(kind=kind, message=message)), encoding="utf-8")
    # contract/world.py imports torch; a rank gets here after importing it, except when that import failed.
    from musubi.contract.world import attempt_id

    # Kept per attempt (error-rank* is cleared by the next attempt): goodput names each failure's cause.
    exits = job_dir / RUN_FILES.exits
    exits.mkdir(parents=True, exist_ok=True)
    # Where it was raised: a failure that repeats at the same line is a defect (recovery/repeats.py).
    where = exception_site(exc) if exc is not None else {}
    record = ExitRecord(rank=rank, kind=kind, message=message[:500], time=time.time(), **where)
    (exits / f"a{attempt_id()}-rank{rank}.json").write_text(json.dumps(record), encoding="utf-8")


def refused_restart(job_dir: Path, rank: int, restarts: int) -> int | None:
    """The exit code when torchrun restarted a rank that failed for good (bad input, a defect), else None.

    Otherwise the previous attempt's error file is cleared: this attempt starts with a clean slate.
    """
    path = error_path(job_dir, rank)
    if restarts and path.is_file():
        try:
            kind = json.loads(path.read_text(encoding="utf-8")).get("kind")
        except ValueError:
            kind = None
        if kind in FINAL_KINDS:
            return FINAL_KINDS[kind]
    path.unlink(missing_ok=True)
    return None


def crashed(job_dir: Path, rank: int, exc: Exception) -> int:
    """Record a failure with no recovery of its own and return its exit code: bad input 2, anything else 1."""
    if isinstance(exc, ConfigError):
        write_error(job_dir, rank, "config", str(exc))
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    write_error(job_dir, rank, type(exc).__name__, f"{type(exc).__name__}: {exc}", exc)
    traceback.print_exception(exc)
    return EXIT_FAILED
