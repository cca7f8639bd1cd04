"""`musubi data watch`: start a fleet whenever a labelled data set gets a new content version.

The labelling tool exports into DIR; each poll hashes DIR (cheap: unchanged files
come from the digest cache), and a version is acted on only once it has held
still for `settle` seconds, so a half-written export never starts a fleet. The
last version acted on is kept in `<runs>/watch-<fleet>.json`, so a restarted
watcher does not retrain the same data. The fleet itself puts the previous best
model first (musubi.fleet.local.previous_best).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musubi.data.version import hash_dataset
from musubi.store.rundir import read_json, write_json


@dataclass
class WatchState:
    """What the watcher last acted on."""

    path: Path

    def last(self) -> str | None:
        """The version last started (None before the first)."""
        if not self.path.is_file():
            return None
        try:
            return read_json(self.path).get("version")
        except (OSError, ValueError, AttributeError):
            return None

    def record(self, version: str, **detail: Any) -> None:
        """Remember that `version` was acted on."""
        write_json(self.path, {"version": version, "time": time.time(), **detail})


def settled_version(data_dir: Path, store: Path, settle_s: float, sleep: Callable[[float], None] = time.sleep
                    ) -> str:
    """The version of DIR once two hashes `settle_s` apart agree (an export in progress keeps changing it)."""
    version = hash_dataset(data_dir, store).version
    while True:
        sleep(settle_s)
        again = hash_dataset(data_dir, store).version
        if again == version:
            return version
        version = again


def watch(data_dir: Path, state: WatchState, store: Path, start: Callable[[str], Any], *, interval_s: float,
          once: bool, settle_s: float = 2.0, max_polls: int | None = None,
          sleep: Callable[[float], None] = time.sleep, say: Callable[[str], None] = print) -> list[str]:
    """Poll DIR; on a new settled version call `start(version)` and record it. Returns the versions started."""
    started: list[str] = []
    polls = 0
    while True:
        polls += 1
        version = settled_version(data_dir, store, settle_s, sleep)
        if version != state.last():
            say(f"{data_dir}: new version {version} (last: {state.last() or 'none'}); starting the fleet")
            result = start(version)
            state.record(version, data_dir=str(data_dir), result=str(result))
            started.append(version)
        else:
            say(f"{data_dir}: version {version} unchanged")
        if once or (max_polls is not None and polls >= max_polls):
            return started
        sleep(interval_s)
