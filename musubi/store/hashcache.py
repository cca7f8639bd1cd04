"""File-digest cache in `musubi.db`: sha256 of a file keyed by (path, size, mtime_ns).

A dataset version hashes every byte once; later versions re-read only files whose
size or mtime changed. A missing or unreadable database only costs a re-hash.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS file_digest (
    path TEXT PRIMARY KEY,     -- absolute path
    size INTEGER NOT NULL,     -- bytes when hashed
    mtime_ns INTEGER NOT NULL, -- st_mtime_ns when hashed
    sha256 TEXT NOT NULL,
    created REAL NOT NULL
);
"""

Key = tuple[str, int, int]  # absolute path, size, mtime_ns


def lookup_digests(db: Path, keys: list[Key]) -> dict[str, str]:
    """path -> sha256 for the keys whose size and mtime still match."""
    if not db.exists() or not keys:
        return {}
    wanted = {k[0]: k for k in keys}
    try:
        with sqlite3.connect(str(db), timeout=30) as con:
            con.executescript(SCHEMA)
            rows = con.execute("SELECT path, size, mtime_ns, sha256 FROM file_digest").fetchall()
    except sqlite3.Error:
        return {}
    return {p: d for p, s, m, d in rows if wanted.get(p) == (p, s, m)}


def store_digests(db: Path, entries: list[tuple[Key, str]]) -> None:
    """Remember digests (best effort: a read-only store only loses the cache)."""
    if not entries:
        return
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(str(db), timeout=30) as con:
            con.executescript(SCHEMA)
            now = time.time()
            con.executemany("INSERT OR REPLACE INTO file_digest VALUES (?, ?, ?, ?, ?)",
                            [(p, s, m, d, now) for (p, s, m), d in entries])
    except (sqlite3.Error, OSError):
        pass
