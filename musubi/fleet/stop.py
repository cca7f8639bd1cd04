"""Stopping a fleet cleanly: signals are noted and acted on, each job's process tree is ended, RUN/ is locked.

`musubi run` starts every job in a session of its own (`start_new_session=True`), so the job's whole
process group (`musubi train`, torchrun, the external program and its children) can be signalled at
once; launch/proctree.stop_trees ends each tree, torchrun's workers (in sessions of their own) included.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from musubi.contract.errors import ConfigError
from musubi.contract.exits import after_signal


class FleetInterrupted(Exception):
    """`musubi run` was told to stop (SIGTERM, SIGINT or SIGHUP); `code` is the exit status to use."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.code = after_signal(signum)
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
