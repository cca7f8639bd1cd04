"""The tiny task (`tests.support.threaded_task:make`) with a thread started at import: a warm spare that imported it
must refuse to fork (a child would inherit locks that thread may hold), and the launch starts plain."""

from __future__ import annotations

import threading
import time

from tests.support.tiny_task import make

__all__ = ["make"]

threading.Thread(target=time.sleep, args=(3600,), name="threaded-task", daemon=True).start()
