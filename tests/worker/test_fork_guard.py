"""Every fork of a rank waits for a quiet rank, on the Pythons whose forked children can hang on a thread entering
Python during the fork (musubi/worker/fork_guard.py; python/cpython#112275)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from musubi.worker.fork_guard import fork_needs_quiet, wait_for_quiet

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("version", "hangs"), [
    ((3, 10, 14), True), ((3, 10, 15), False), ((3, 11, 0), True), ((3, 11, 7), True), ((3, 11, 9), True),
    ((3, 11, 10), False), ((3, 12, 0), False), ((3, 13, 1), False),
])
def test_the_pythons_whose_forked_child_takes_the_thread_list_lock_before_renewing_it(version: tuple[int, ...],
                                                                                    hangs: bool) -> None:
    """3.11.10 and 3.10.15 carry the fix (python/cpython#112336); 3.12 renews the lock first."""
    assert fork_needs_quiet(version) is hangs


def test_a_thread_running_outside_the_gil_keeps_the_rank_from_forking_until_it_sleeps() -> None:
    """Gloo's runloop creating a thread state is such a thread (fork_guard.py); a thread hashing a large buffer,
    which runs without the GIL, stands in for it. Asleep (waiting on an event), it no longer counts."""
    go, stop = threading.Event(), threading.Event()

    def hash_until_stopped() -> None:
        data = bytes(1 << 24)
        go.set()
        while not stop.is_set():
            hashlib.sha256(data).digest()

    worker = threading.Thread(target=hash_until_stopped, daemon=True)
    worker.start()
    go.wait()
    t0 = time.monotonic()
    assert any(f"({worker.native_id})" in b for b in wait_for_quiet(timeout_s=0.3))
    assert 0.3 <= time.monotonic() - t0 < 5
    stop.set()
    worker.join()
    idle = threading.Thread(target=threading.Event().wait, args=(30,), daemon=True)
    idle.start()
    busy = wait_for_quiet(timeout_s=5)
    assert not any(f"({idle.native_id})" in b for b in busy), busy


# Run in a process of its own: the at-fork hook cannot be removed once registered.
_FORKS = """
import json, os, sys, threading
from musubi.worker import fork_guard
fork_guard.fork_needs_quiet = lambda: sys.argv[1] == "affected"
settled = []
out = {"installed": fork_guard.quiet_forks(), "again": fork_guard.quiet_forks(lambda: settled.append(1))}

def fork_and_reap():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)

fork_and_reap()  # from the main thread: the save in flight first
out["main"] = len(settled)
t = threading.Thread(target=fork_and_reap)  # another thread (a CUDA rank's prefetch thread): quiet only
t.start(); t.join()
out["thread"] = len(settled)
print(json.dumps(out))
"""


@pytest.mark.parametrize("python", ["affected", "fixed"])
def test_forks_wait_for_the_save_from_the_main_thread_only_and_only_on_an_affected_python(python: str) -> None:
    res = subprocess.run([sys.executable, "-c", _FORKS, python], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, check=True)
    got = json.loads(res.stdout)
    if python == "affected":
        assert got == {"installed": True, "again": True, "main": 1, "thread": 1}
    else:
        assert got == {"installed": False, "again": False, "main": 0, "thread": 0}
