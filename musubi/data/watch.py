"""`musubi data watch`: start a fleet whenever a labelled data set gets a new content version.

The labelling tool exports into DIR; each poll hashes DIR (cheap: unchanged files
come from the digest cache), and a version is acted on only once it has held
still for `settle` seconds, so a half-written export never starts a fleet. A file
that vanishes or cannot be read while hashing (temp files renamed by the tool)
makes the version "not settled": the watcher tries again, it does not die. The
last version the fleet ran on is kept in `<runs>/watch-<fleet>.json`, so a
restarted watcher does not retrain the same data; a version whose fleet did not
start (StartFailed) is not recorded as done and is tried again on the next poll.
The fleet itself puts the previous best model first (musubi.fleet.local.previous_best).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.data.version import hash_dataset
from musubi.store.rundir import read_json, write_json

#: Hashes in a row that may fail (files vanishing mid-export) before settled_version gives up.
MAX_UNREADABLE = 30


class StartFailed(Exception):
    """Raised by a watcher's `start` when the fleet did not start: the version stays to do."""


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
        """Remember that `version` was acted on (the fleet ran)."""
        write_json(self.path, {"version": version, "time": time.time(), **detail})

    def record_failure(self, version: str, reason: str) -> None:
        """Note that the fleet for `version` did not start; the last version acted on stays as it was."""
        write_json(self.path, {"version": self.last(), "time": time.time(), "not_started": version,
                               "reason": reason})


def settled_version(data_dir: Path, store: Path, settle_s: float, sleep: Callable[[float], None] = time.sleep
                    ) -> str:
    """The version of DIR once two hashes `settle_s` apart agree (an export in progress keeps changing it).

    A hash that fails (a file vanished, an image listed but not yet written) counts as "still changing";
    after MAX_UNREADABLE failures in a row the last error is raised.
    """
    failures = 0

    def one() -> str | None:
        nonlocal failures
        try:
            v = hash_dataset(data_dir, store).version
        except (ConfigError, OSError):
            failures += 1
            if failures >= MAX_UNREADABLE:
                raise
            return None
        failures = 0
        return v

    version = one()
    while True:
        sleep(settle_s)
        again = one()
        if again is not None and again == version:
            return again
        version = again


def watch(data_dir: Path, state: WatchState, store: Path, start: Callable[[str], Any], *, interval_s: float,
          once: bool, settle_s: float = 2.0, max_polls: int | None = None,
          sleep: Callable[[float], None] = time.sleep, say: Callable[[str], None] = print) -> list[str]:
    """Poll DIR; on a new settled version call `start(version)` and record it. Returns the versions started.

    `start` raises StartFailed when the fleet did not start: the version is not recorded, so the next
    poll tries it again. An unreadable DIR is reported and polled again (with `once`, the error is raised).
    """
    started: list[str] = []
    polls = 0
    while True:
        polls += 1
        try:
            version: str | None = settled_version(data_dir, store, settle_s, sleep)
        except (ConfigError, OSError) as e:
            if once:
                raise
            say(f"{data_dir}: cannot be hashed now ({e}); trying again in {interval_s:g} s")
            version = None
        if version is not None and version != state.last():
            say(f"{data_dir}: new version {version} (last: {state.last() or 'none'}); starting the fleet")
            try:
                result = start(version)
            except StartFailed as e:
                say(f"{data_dir}: the fleet for {version} did not start ({e}); it is tried again next poll")
                state.record_failure(version, str(e))
            else:
                state.record(version, data_dir=str(data_dir), result=str(result))
                started.append(version)
        elif version is not None:
            say(f"{data_dir}: version {version} unchanged")
        if once or (max_polls is not None and polls >= max_polls):
            return started
        sleep(interval_s)
