"""A process's creation time, as the start-up marks read it (contract/spare_client.process_created: the worker's
and the fleet's first mark)."""

from __future__ import annotations

import subprocess
import sys
import time

from musubi.contract.spare_client import process_created

#: /proc counts a process's start in clock ticks (10 ms on Linux); one tick of slack either side.
TICK_S = 0.011


def test_a_child_was_created_between_its_spawn_and_its_own_reading() -> None:
    """Not before the parent asked for it: /proc/stat's btime is whole seconds, so btime + start ticks (psutil's
    create_time) put a child up to 1 s before its spawn; a rank forked in 0.1 s then seemed to start before the
    launcher that asked for it (tests/worker/test_distributed_train.py's marks)."""
    for _ in range(5):
        before = time.time()
        out = subprocess.run([sys.executable, "-c", "import time; from musubi.contract.spare_client import "
                              "process_created as p; print(p(), time.time())"],
                             capture_output=True, text=True, check=True, timeout=60)
        after = time.time()
        created, read_at = map(float, out.stdout.split())
        assert before - TICK_S <= created <= read_at + TICK_S <= after + TICK_S, (before, created, read_at, after)


def test_this_process_was_created_before_now() -> None:
    assert process_created() <= time.time() + TICK_S
