"""Pixel statistics per dataset version in `musubi.db`: computed once per content version, read by every launch.

A version (`data-…`) names exact bytes, so its statistics never go stale; a missing or
unreadable database only costs reading the images again.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS pixel_stats (
    version TEXT PRIMARY KEY,  -- content version of the split (musubi.data.version), e.g. data-0123abcd
    stats TEXT NOT NULL,       -- JSON: images, pixels, dtype, mean, std, min, max (musubi.data.pixels)
    created REAL NOT NULL
);
"""


def lookup_pixel_stats(db: Path | None, version: str) -> dict[str, Any] | None:
    """The statistics recorded for `version`, or None."""
    if db is None or not db.exists():
        return None
    try:
        with sqlite3.connect(str(db), timeout=30) as con:
            con.executescript(SCHEMA)
            row = con.execute("SELECT stats FROM pixel_stats WHERE version = ?", (version,)).fetchone()
        return json.loads(row[0]) if row else None
    except (sqlite3.Error, ValueError):
        return None


def store_pixel_stats(db: Path | None, version: str, stats: dict[str, Any]) -> None:
    """Record the statistics of `version` (best effort: a read-only store only loses the cache)."""
    if db is None:
        return
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(str(db), timeout=30) as con:
            con.executescript(SCHEMA)
            con.execute("INSERT OR REPLACE INTO pixel_stats VALUES (?, ?, ?)",
                        (version, json.dumps(stats, sort_keys=True), time.time()))
    except (sqlite3.Error, OSError):
        pass
