"""Repeated failures: the same cause striking again after a restart is a defect, not a transient fault.

Restarts are for faults that go away (a killed rank, a lost node, a hang behind a slow peer).
A crash that comes back after the restart, say at every checkpoint, is a bug: restarting again
only hides it behind a lower goodput. So two consecutive attempts of one launch (torchrun
restarts `L.k` and `L.k+1`) that failed with the same cause make the job's failure a *defect*:

- same cause: the same Python exception (type, message with numbers and addresses blanked, and
  the line that raised it: the innermost frame, and the innermost frame of musubi itself), on
  whichever rank raised it; or a death by the same crash signal (SIGSEGV, SIGABRT, SIGBUS,
  SIGFPE, SIGILL);
- never a defect this way: SIGKILL/SIGTERM (the kernel's OOM killer, preemption, a drill), hangs,
  OOMs and non-finite losses (they have their own fallbacks: a smaller batch, a safer precision),
  configuration errors (already not restarted), and errors of the network or the rendezvous.

The next attempt (`L.k+2`) does not train: rank 0 sees the repeat, the ranks agree on it (one
all-reduce), rank 0 logs one error line, every rank records it (`logs/error-rank{r}.txt`, kind
`defect`) and exits with EXIT_DEFECT (contract/exits.py); later restarts of the launch exit at once. The launch then
fails with that line; `goodput.json` (`defect`, `repeat_of` per failure), `job.json`, the fleet
(no retry) and the checklist report it as a failure, never as "recovered". A new launch
(`--resume`, after a fix) starts with a clean slate.
"""

from __future__ import annotations

import re
import signal
import traceback
from pathlib import Path
from typing import Any

#: Deaths by these signals come from the code (a native crash), not from outside.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})

#: Error kinds (exception type names) that are not defects: their own recovery, or a cause outside the code.
_NOT_DEFECTS = frozenset({"oom", "numerics", "config", "defect", "DistNetworkError", "DistStoreError",
                          "TimeoutError"})

_PKG_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the musubi package
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


def _short(filename: str) -> str:
    p = filename.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in p:
            return p.split(marker, 1)[1]
    try:
        return Path(p).resolve().relative_to(_PKG_ROOT).as_posix()
    except ValueError:
        return p


def exception_site(exc: BaseException) -> dict[str, str]:
    """Where `exc` was raised: `site` (innermost frame) and `ours` (innermost frame in musubi), 'file:line in fn'."""
    frames = traceback.extract_tb(exc.__traceback__)
    out: dict[str, str] = {}
    if frames:
        f = frames[-1]
        out["site"] = f"{_short(f.filename)}:{f.lineno} in {f.name}"
    for f in reversed(frames):
        short = _short(f.filename)
        if short.startswith("musubi/"):
            out["ours"] = f"{short}:{f.lineno} in {f.name}"
            break
    return out


def signature(failure: dict[str, Any]) -> str | None:
    """What makes two failures 'the same cause' (see the module docstring); None: never called a defect."""
    sig = failure.get("signature")
    return sig if isinstance(sig, str) and sig else None


def error_signature(kind: str | None, message: str, site: str | None, ours: str | None) -> str | None:
    """The signature of a rank's recorded Python exception (None for kinds that are no defect)."""
    if not kind or kind in _NOT_DEFECTS or not (site or ours):
        return None
    return f"{kind} | {_NUMBERS.sub('#', message)} | {site or ''} | {ours or ''}"


def signal_signature(code: int) -> str | None:
    """The signature of a death by signal (torchrun's exit code -N); None unless it is a crash signal."""
    if code >= 0:
        return None
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return None
    return f"signal {sig.name}" if sig in CRASH_SIGNALS else None


def _launch(attempt: str) -> str:
    return str(attempt).split(".", 1)[0]


def mark_repeats(failures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Set `repeat_of` on each failure that repeats the one before it (same launch, same signature).

    Returns the defect (the latest chain of repeats): its attempts, signature, the restart it struck
    again after, and `last`, the latest failure of the chain; None when no failure repeated."""
    defect: dict[str, Any] | None = None
    for prev, cur in zip(failures, failures[1:], strict=False):
        sig = signature(cur)
        if sig is None or sig != signature(prev) or _launch(prev["attempt"]) != _launch(cur["attempt"]):
            continue
        cur["repeat_of"] = prev["attempt"]
        if defect is not None and defect["attempts"][-1] == prev["attempt"]:
            defect["attempts"].append(cur["attempt"])
        else:
            defect = {"attempts": [prev["attempt"], cur["attempt"]], "signature": sig}
        defect["last"] = cur
        defect["after_restart"] = int(str(cur["attempt"]).split(".", 1)[1] or 0)
    return defect


def defect_line(job: str, defect: dict[str, Any]) -> str:
    """The one line that says it: which failure (`cause`, in words), after which restart, and that it is a defect."""
    return (f"job {job}: the same failure ({defect['cause']}) struck again after restart {defect['after_restart']} "
            f"(attempts {', '.join(defect['attempts'])}): a defect, not a transient fault; restarts stop here "
            "(fix it, then --resume)")
