"""Musubi's version, kept equal to pyproject.toml's: `musubi.__version__`, and what run.json and env.json record;
and a digest of the code itself, for records that must not outlive a change of it (the version stays 0.1.0
across many changes)."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

VERSION = "0.1.0"


@lru_cache(maxsize=4)
def source_digest(root: Path | None = None) -> str:
    """SHA-256 (16 hex digits) of Musubi's Python sources: every .py file under the package, path and bytes, in
    path order. The same in a git checkout and an installed wheel; any edit changes it (a git commit would miss
    uncommitted edits and is absent from a wheel). `root`: another copy of the package (tests)."""
    root = root or Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
