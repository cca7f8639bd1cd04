"""Every fork of a rank waits until the rank is quiet, on the Pythons whose forked children can hang.

CPython 3.11.0-3.11.9 and 3.10 before 3.10.15 take the lock of the interpreter's thread list in a forked
child before they re-create it (python/cpython#112275, fixed by #112336 in 3.11.10). A fork made while
another thread of the parent holds that lock leaves a child that never returns from os.fork(). A
DataLoader worker forked so never sends a batch: its rank waits for it forever, the other ranks in their
next collective.

Python's own threads take that lock only while they hold the GIL, which the forking thread holds too. The
threads that take it without the GIL are C++ threads entering Python: gloo's `pt_gloo_runloop` threads
destroy each finished collective, and where its tensors have Python objects (FSDP2's all-gathers) the
destructor creates a Python thread state for the decref (pybind11's gil_scoped_acquire -> PyThreadState_New),
after the collective's waiter has already moved on. How it was found (a validation loader's worker hung
inside os.fork() beside 2 FSDP2 CPU ranks; the thread list it inherited headed by its rank's runloop thread)
and what the wait costs: docs/testing.md ("Session 26"), docs/guides/data.md.

So on such a Python a rank makes every fork wait until its work is quiet, through one at-fork hook
(os.register_at_fork) rather than at each place that forks: loader workers (training, validation,
`data.workers: measure`'s probe) and anything a user's dataset forks. Quiet means the save in flight has
ended (its collectives run on a gloo group of their own, whose threads do the same; waited for only by forks
from the main thread, the one that starts saves), and every other thread of the process sleeps in the kernel.
A thread creating a thread state is running code, never asleep, and with no collective left to run, gloo's
threads stay asleep until the fork is done.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("musubi.fork")

#: The longest a rank waits for its other threads to sleep before it forks anyway (a thread busy for longer is
#: computing, not destroying a collective: it holds no lock of the interpreter's).
QUIET_WAIT_S = 2.0


def fork_needs_quiet(version: tuple[int, ...] | None = None) -> bool:
    """Whether this Python's forked children can hang on a thread that enters Python during the fork."""
    v = tuple(sys.version_info[:3]) if version is None else tuple(version[:3])
    return (3, 10, 0) <= v < (3, 10, 15) or (3, 11, 0) <= v < (3, 11, 10)


def busy_threads() -> list[str]:
    """This process's threads other than the caller's that are running, runnable or in uninterruptible sleep,
    as 'name (tid)' (Linux; empty where /proc/self/task cannot be read)."""
    me, out = threading.get_native_id(), []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return []
    for tid in tids:
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
        if state in "RD":
            out.append(f"{name} ({tid})")
    return out


def wait_for_quiet(timeout_s: float = QUIET_WAIT_S, poll_s: float = 0.002) -> list[str]:
    """Wait until every other thread of this process sleeps; return the ones still busy at `timeout_s` (empty:
    quiet). Python threads waiting for the GIL, which the caller holds while it reads, count as asleep."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = busy_threads()
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(poll_s)


#: Whether this process's forks wait for quiet (the at-fork hook is registered once: it cannot be removed).
_quiet = False
#: The rank's wait for its save in flight (Checkpointer.wait), once it has a checkpointer.
_settle: Callable[[], Any] | None = None


def quiet_forks(settle: Callable[[], Any] | None = None) -> bool:
    """On such a Python, make every later os.fork() of this process wait for quiet first; `settle`: the wait for
    the save in flight, called first by forks from the main thread. Returns whether forks wait (False elsewhere).
    A rank calls it once its process group exists, and again with its checkpointer's wait."""
    global _quiet, _settle
    if not fork_needs_quiet():
        return False
    if not _quiet:
        os.register_at_fork(before=_before_fork)
        _quiet = True
    if settle is not None:
        _settle = settle
    return True


def _before_fork() -> None:
    if _settle is not None and threading.current_thread() is threading.main_thread():
        _settle()
    busy = wait_for_quiet()
    if busy:
        log.info("forked beside %d busy thread(s) after %.0f s: %s", len(busy), QUIET_WAIT_S, ", ".join(busy[:4]))
