"""Ending a process tree whose members may sit in sessions of their own (torchrun's workers do).

One mechanism for the fleet (stopping its jobs on a signal) and the launcher (a drill run past its
deadline): the descendants are found (psutil) before the leader's group is signalled, TERM first,
KILL after a grace period, so none outlives its parent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from musubi.contract.env import MUSUBI_STOP_GRACE

#: Seconds a job gets to stop after SIGTERM before its processes are killed (env MUSUBI_STOP_GRACE).
GRACE_S = 20.0


def grace_s() -> float:
    try:
        return float(os.environ.get(MUSUBI_STOP_GRACE, GRACE_S))
    except ValueError:
        return GRACE_S


def _descendants(pid: int) -> list:
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - gone already, or no psutil: the group signal still reaches most
        return []


def stop_trees(procs: list[subprocess.Popen], grace: float | None = None) -> None:
    """SIGTERM each job's process group (and every descendant), wait up to `grace` s, then SIGKILL what is left."""
    grace = grace_s() if grace is None else grace
    found = {p.pid: _descendants(p.pid) for p in procs}
    for p in procs:
        _signal_group(p, signal.SIGTERM)
        for d in found[p.pid]:
            with contextlib.suppress(Exception):
                d.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        _signal_group(p, signal.SIGKILL)
        for d in found[p.pid] + _descendants(p.pid):
            with contextlib.suppress(Exception):
                if d.is_running():
                    d.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)  # the job leads its own session: its group id is its pid
    except (ProcessLookupError, PermissionError):
        pass
    except OSError:
        with contextlib.suppress(OSError):
            p.send_signal(sig)
