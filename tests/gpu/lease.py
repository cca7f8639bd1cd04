"""GPUs for concurrent GPU tests: a lease file shared by pytest-xdist workers.

Each test asks for the GPUs its job needs; the lease hands out free ones (the lowest ids first) and
holds a request for more GPUs than are free while smaller requests wait behind it, so a 4-GPU test
is not starved by a stream of 2-GPU tests. Leases of dead processes are reclaimed. torchtitan's GPU
test runner packs its jobs the same way: largest first.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from musubi.contract.spare_client import process_alive  # a zombie counts as ended

LEASE = Path(os.environ.get("MUSUBI_GPU_LEASE", "/tmp/musubi-gpu-lease.json"))


@contextmanager
def _locked() -> Iterator[dict]:
    LEASE.parent.mkdir(parents=True, exist_ok=True)
    with open(LEASE.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(LEASE.read_text()) if LEASE.is_file() else {}
        except ValueError:
            state = {}
        state.setdefault("held", {})  # gpu id -> pid
        state.setdefault("waiting", {})  # pid -> gpus wanted
        state["held"] = {g: p for g, p in state["held"].items() if process_alive(int(p))}
        state["waiting"] = {p: n for p, n in state["waiting"].items() if process_alive(int(p))}
        yield state
        LEASE.write_text(json.dumps(state))
        fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def lease(n: int, total: int, timeout_s: float = 600.0) -> Iterator[list[int]]:
    """Hold `n` of the machine's `total` GPUs for the duration of the block; yields their ids."""
    me = str(os.getpid())
    deadline = time.monotonic() + timeout_s
    got: list[int] = []
    while True:
        with _locked() as st:
            free = [g for g in range(total) if str(g) not in st["held"]]
            bigger = [int(w) for p, w in st["waiting"].items() if p != me and int(w) > n]
            if len(free) >= n and not bigger:
                got = free[:n]
                for g in got:
                    st["held"][str(g)] = me
                st["waiting"].pop(me, None)
                break
            st["waiting"][me] = n
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {n} free GPUs of {total} within {timeout_s:.0f}s")
        time.sleep(0.5)
    try:
        yield got
    finally:
        with _locked() as st:
            for g in got:
                st["held"].pop(str(g), None)
