"""When a loader forks its worker processes, and what must be quiet in the rank first.

CPython 3.11.0-3.11.9 and 3.10 before 3.10.15 take the lock of the interpreter's thread list in a forked
child before they re-create it (python/cpython#112275, fixed by #112336 in 3.11.10). A fork made while
another thread of the parent holds that lock leaves a child that never returns from os.fork(). A
DataLoader worker forked so never sends a batch: its rank waits for it forever, the other ranks in their
next collective.

Python's own threads take that lock only while they hold the GIL, which the forking thread holds too. The
threads that take it without the GIL are C++ threads entering Python: gloo's `pt_gloo_runloop` threads
destroy each finished collective, and where its tensors have Python objects (FSDP2's all-gathers) the
destructor creates a Python thread state for the decref (pybind11's gil_scoped_acquire -> PyThreadState_New),
after the collective's waiter has already moved on. Seen here (2 CPU ranks, FSDP2, Python 3.11.7): the
validation loader's worker hung inside os.fork() once in about 60 runs; the thread list it inherited was
headed by its rank's runloop thread, and gdb on a live rank shows the runloop creating a thread state from
~AsyncAllgatherWork at every all-gather.

So on such a Python a rank forks loader workers only when its work is quiet: the save in flight has ended
(its collectives run on a gloo group of their own, whose threads do the same), and every other thread of the
process sleeps in the kernel. A thread creating a thread state is running code, never asleep, and with no
collective left to run, gloo's threads stay asleep until the fork is done.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("musubi.feed")

#: The longest a rank waits for its other threads to sleep before it forks anyway (a thread busy for longer is
#: computing, not destroying a collective: it holds no lock of the interpreter's).
QUIET_WAIT_S = 2.0


def fork_needs_quiet(version: tuple[int, ...] | None = None) -> bool:
    """Whether this Python's forked children can hang on a thread that enters Python during the fork."""
    v = tuple(sys.version_info[:3]) if version is None else tuple(version[:3])
    return (3, 10, 0) <= v < (3, 10, 15) or (3, 11, 0) <= v < (3, 11, 10)


def starts_workers(loader: Any) -> bool:
    """Whether iterating the DataLoader `loader` now forks worker processes: it has workers and keeps none alive
    from an earlier pass (persistent workers are forked once, at the first pass)."""
    if loader.num_workers <= 0:
        return False
    return not loader.persistent_workers or getattr(loader, "_iterator", None) is None


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


def quiet_before_fork(settle: Callable[[], Any]) -> None:
    """Before a loader forks on such a Python: `settle()` (the checkpoint in flight), then wait for quiet."""
    settle()
    busy = wait_for_quiet()
    if busy:
        log.info("loader workers forked beside %d busy thread(s) after %.0f s: %s", len(busy), QUIET_WAIT_S,
                 ", ".join(busy[:4]))
