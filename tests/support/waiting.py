"""Waiting on another process's side effect (a socket, a pid file, a commit marker) without a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(pred: Callable[[], object], timeout: float = 20.0, interval: float = 0.05) -> bool:
    """Whether `pred()` became true within `timeout` seconds, asked every `interval` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return False
