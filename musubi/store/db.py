"""`musubi.db`: the SQLite index beside the run directories (batch-size and single-GPU baseline caches, and
the history of how long each fleet job took, which the fleet's duration model reads).

It can always be rebuilt from the run directories (each probe is also written to
`JOB/memory/probe.json`); a missing or unreadable database only costs a probe.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_cache (
    key TEXT PRIMARY KEY,      -- JSON of what decides the batch: model, input, precision, strategy, GPU, torch
    batch INTEGER NOT NULL,    -- largest per-rank batch that fit (agreed by all ranks)
    detail TEXT NOT NULL,      -- JSON: peak memory, trials, seconds, run directory
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS baseline_cache (
    key TEXT PRIMARY KEY,      -- JSON: the job's config, the machine (host, GPU model), steps, torch
    samples_per_s REAL NOT NULL, -- median single-GPU throughput over the baseline's steps
    detail TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS job_runs (
    key TEXT NOT NULL,         -- JSON: the job's config (or command), the machine (host + GPU models), device kind
    width INTEGER NOT NULL,    -- GPUs (or CPU ranks) the job ran on
    seconds REAL NOT NULL,     -- start to end in the fleet: start-up, training and evaluation
    startup_s REAL,            -- start to the first training log record (None: unknown, e.g. external commands)
    detail TEXT NOT NULL,      -- JSON: run directory, samples/s
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS job_runs_key ON job_runs (key);
"""


def db_path(run_dir: Path) -> Path:
    """`musubi.db` beside the run directory (runs/musubi.db for runs/<time>-<name>)."""
    return run_dir.resolve().parent / "musubi.db"


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(str(path), timeout=30)
    con.executescript(SCHEMA)
    return con


def cache_key(fields: dict[str, Any]) -> str:
    """Canonical JSON of the fields that decide a batch size."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def lookup_batch(path: Path, key: str) -> tuple[int, dict[str, Any]] | None:
    """(batch, detail) cached for `key`, or None."""
    if not path.exists():
        return None
    try:
        with _connect(path) as con:
            row = con.execute("SELECT batch, detail FROM batch_cache WHERE key = ?", (key,)).fetchone()
    except sqlite3.Error:
        return None
    return (int(row[0]), json.loads(row[1])) if row else None


def store_batch(path: Path, key: str, batch: int, detail: dict[str, Any]) -> None:
    """Remember a probed batch (replacing an older entry of the same key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _connect(path) as con:
        con.execute("INSERT OR REPLACE INTO batch_cache VALUES (?, ?, ?, ?)",
                    (key, batch, json.dumps(detail), time.time()))


def lookup_baseline(path: Path, key: str) -> tuple[float, dict[str, Any]] | None:
    """(samples/s, detail) of a cached single-GPU baseline, or None."""
    if not path.exists():
        return None
    try:
        with _connect(path) as con:
            row = con.execute("SELECT samples_per_s, detail FROM baseline_cache WHERE key = ?", (key,)).fetchone()
    except sqlite3.Error:
        return None
    return (float(row[0]), json.loads(row[1])) if row else None


def store_baseline(path: Path, key: str, samples_per_s: float, detail: dict[str, Any]) -> None:
    """Remember a measured baseline (replacing an older entry of the same key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _connect(path) as con:
        con.execute("INSERT OR REPLACE INTO baseline_cache VALUES (?, ?, ?, ?)",
                    (key, samples_per_s, json.dumps(detail), time.time()))


def store_job_run(path: Path, key: str, width: int, seconds: float, startup_s: float | None,
                  detail: dict[str, Any]) -> None:
    """Remember how long one fleet job took on `width` GPUs (every successful run adds a row)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _connect(path) as con:
        con.execute("INSERT INTO job_runs VALUES (?, ?, ?, ?, ?, ?)",
                    (key, width, seconds, startup_s, json.dumps(detail), time.time()))


def job_runs(path: Path, key: str, newest: int = 10) -> list[dict[str, Any]]:
    """The newest recorded runs of `key` (width, seconds, startup_s, detail), newest first; [] if none."""
    if not path.exists():
        return []
    try:
        with _connect(path) as con:
            rows = con.execute("SELECT width, seconds, startup_s, detail FROM job_runs WHERE key = ? "
                               "ORDER BY created DESC LIMIT ?", (key, newest)).fetchall()
    except sqlite3.Error:
        return []
    return [{"width": int(w), "seconds": float(s), "startup_s": None if u is None else float(u),
             "detail": json.loads(d)} for w, s, u, d in rows]


def baselines_of(path: Path, config: dict[str, Any], machine: list[Any]) -> list[float]:
    """Single-GPU samples/s of every cached baseline of this job config on this machine (any step count)."""
    if not path.exists():
        return []
    try:
        with _connect(path) as con:
            rows = con.execute("SELECT key, samples_per_s FROM baseline_cache").fetchall()
    except sqlite3.Error:
        return []
    out = []
    for key, rate in rows:
        try:
            k = json.loads(key)
        except ValueError:
            continue
        if isinstance(k, dict) and k.get("config") == config and k.get("machine") == machine:
            out.append(float(rate))
    return out
