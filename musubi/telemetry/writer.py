"""The background thread that resolves CUDA events and appends telemetry lines to a rank's file.

The training thread only enqueues Python objects; this thread waits for the
events of a step to complete (`Event.synchronize` releases the GIL), turns them
into milliseconds and writes one JSON line. A step never waits for it.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("musubi.telemetry")

#: Lines are flushed at least this often (seconds), so a live watcher and a crash both see recent steps.
FLUSH_S = 0.5


class TelemetryWriter:
    """Append JSON lines to `path` from a daemon thread; items are dicts or callables returning one."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._f = open(path, "a", encoding="utf-8")
        self._thread = threading.Thread(target=self._run, name=f"musubi-telemetry-{path.stem}", daemon=True)
        self._thread.start()

    def put(self, item: dict[str, Any] | Callable[[], dict[str, Any] | None]) -> None:
        """Queue a record (or a function that builds it once its CUDA events are done)."""
        self._q.put(item)

    def _run(self) -> None:
        last_flush = time.monotonic()
        while True:
            try:
                item = self._q.get(timeout=FLUSH_S)
            except queue.Empty:
                item = ...
            if item is None:
                break
            if item is not ...:
                try:
                    rec = item() if callable(item) else item
                    if rec is not None:
                        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")
                except Exception as e:  # telemetry must never end a run
                    log.warning("telemetry record dropped: %s", e)
            if time.monotonic() - last_flush >= FLUSH_S:
                self._f.flush()
                last_flush = time.monotonic()
        self._f.flush()

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued and stop the thread."""
        self._q.put(None)
        self._thread.join(timeout_s)
        self._f.close()
