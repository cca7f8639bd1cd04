"""Stopping a fleet cleanly: signals are noted and acted on, each job's process tree is ended, RUN/ is locked.

`musubi run` starts every job in a session of its own (`start_new_session=True`), so the job's whole
process group (`musubi train`, torchrun, the external program and its children) can be signalled at
once. torchrun starts its workers in sessions of their own; they are found as descendants (psutil)
before the group is signalled, so none outlives the fleet.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from musubi.config.errors import ConfigError

#: Seconds a job gets to stop after SIGTERM before its processes are killed (env MUSUBI_STOP_GRACE).
GRACE_S = 20.0


class FleetInterrupted(Exception):
    """`musubi run` was told to stop (SIGTERM, SIGINT or SIGHUP); `code` is the exit status to use."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.code = 128 + signum
        self.run_dir: Path | None = None  # set by run_fleet
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


@contextlib.contextmanager
def signals_flagged() -> Iterator[list[int]]:
    """While inside: SIGTERM, SIGINT and SIGHUP are recorded in the yielded list, not raised. The fleet's loop
    checks it at safe points (never between starting a job and recording it), and its clean-up runs inside
    too, so a second Ctrl-C cannot cut the stopping of the jobs short."""
    import threading

    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield got
        return

    def handler(signum: int, frame: object) -> None:  # noqa: ARG001
        got.append(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def grace_s() -> float:
    try:
        return float(os.environ.get("MUSUBI_STOP_GRACE", GRACE_S))
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


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on RUN/.lock while inside; refuse (ConfigError) if a live run holds it."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = f" (pid {int(os.read(fd, 32).decode().strip())})"
        os.close(fd)
        raise ConfigError(f"{run_dir} is in use by a live `musubi run`{holder}; stop it first or wait for it to "
                          "end") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def check_unlocked(run_dir: Path) -> None:
    """Refuse now (without taking it) if a live run holds RUN/.lock."""
    if (run_dir / ".lock").is_file():
        with run_lock(run_dir):
            pass
