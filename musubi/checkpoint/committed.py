"""Which checkpoints are committed and intact: the marker, the directory names, verification. No torch.

A checkpoint directory `step-000000123/` is committed when its `COMMITTED` marker (written last, by rank 0,
once every rank's shards are durable) is valid and every file it lists has its size (and, checked before a
resume loads it, its SHA-256). Reading this needs no torch, so the launcher checks a `--resume` with it before
it imports anything heavy; checkpoint.py (DCP save and load) imports these names from here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("musubi.checkpoint")

MARKER = "COMMITTED"
STATE_FILE = "state.json"
#: A checkpoint directory's name: the optimizer step it was taken after, 9 digits.
CHECKPOINT_DIR = re.compile(r"^step-(\d{9})$")


def step_dir(root: Path, step: int) -> Path:
    """Directory of the checkpoint taken after optimizer step `step`."""
    return root / f"step-{step:09d}"


def outside_link(ckpt_dir: Path) -> str | None:
    """Why a checkpoint directory reaches outside its `checkpoints/` folder through a symlink, or None.

    A checkpoint is loaded from the job's own folder only; weights from anywhere else are
    named explicitly (`weights:`), never followed through a link planted in a run directory.
    """
    root = ckpt_dir.parent.resolve()
    if ckpt_dir.is_symlink() or ckpt_dir.resolve().parent != root:
        return f"{ckpt_dir.name} is a symlink to {ckpt_dir.resolve()}"
    for p in ckpt_dir.iterdir():
        if p.is_symlink() and p.resolve().parent != ckpt_dir.resolve():
            return f"{ckpt_dir.name}/{p.name} is a symlink to {p.resolve()}"
    return None


def listing(d: Path) -> dict[str, int]:
    """Every file of a checkpoint directory but its marker, with its size in bytes."""
    return {p.name: p.stat().st_size for p in sorted(d.iterdir()) if p.is_file() and p.name != MARKER}


def sha256(path: Path) -> str:
    """A file's SHA-256, hex."""
    # hashlib releases the GIL on large buffers: a background commit does not stall the training thread.
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _skip(warn: bool, msg: str, *args: Any) -> None:
    if warn:
        log.warning(msg, *args)


@dataclass(frozen=True)
class Committed:
    """A checkpoint whose marker is valid and whose files match it."""

    path: Path
    step: int
    marker: dict[str, Any]


def verify(d: Path, checksums: bool = False, warn: bool = True) -> Committed | None:
    """The checkpoint in `d` if it is committed and intact, else None (with the reason logged).

    Sizes are always compared with the marker; `checksums` also re-reads every file
    and compares its SHA-256 (done once, on the checkpoint a resume is about to load).
    """
    m = CHECKPOINT_DIR.match(d.name)
    if not m or not d.is_dir():
        return None
    marker_path = d / MARKER
    if not marker_path.is_file():
        _skip(warn, "skipping %s: no %s marker (a save that did not finish)", d, MARKER)
        return None
    try:
        marker = json.loads(marker_path.read_text(encoding="utf-8"))
        files = marker["files"]
        step = int(marker["step"])
    except (ValueError, KeyError, TypeError):
        _skip(warn, "skipping %s: unreadable %s marker", d, MARKER)
        return None
    if step != int(m.group(1)):
        _skip(warn, "skipping %s: marker says step %s", d, step)
        return None
    if (escape := outside_link(d)) is not None:
        log.warning("skipping %s: %s (a checkpoint is read from the job's own folder only)", d.name, escape)
        return None
    actual = listing(d)
    for name, size in files.items():
        if actual.get(name) != size:
            _skip(warn, "skipping %s: %s is missing or has the wrong size (damaged checkpoint)", d, name)
            return None
    if checksums:
        for name, digest in marker.get("sha256", {}).items():
            if sha256(d / name) != digest:
                _skip(warn, "skipping %s: %s fails its SHA-256 checksum (corrupted checkpoint)", d, name)
                return None
    return Committed(d, step, marker)


def committed_checkpoints(root: Path, warn: bool = True) -> list[Committed]:
    """All intact committed checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [verify(d, warn=warn) for d in sorted(root.iterdir()) if CHECKPOINT_DIR.match(d.name)]
    return [c for c in found if c is not None]


def latest_checkpoint(root: Path, checksums: bool = False, warn: bool = True) -> Committed | None:
    """The newest intact committed checkpoint, or None; damaged newer ones are skipped with a warning."""
    if not root.is_dir():
        return None
    for d in sorted((d for d in root.iterdir() if CHECKPOINT_DIR.match(d.name)), reverse=True):
        found = verify(d, checksums, warn)
        if found is not None:
            return found
    return None


def by_score(committed: list[Committed], metric: str, mode: str) -> list[Committed]:
    """Checkpoints whose marker holds `metric`, best first (`mode` max: larger is better)."""
    scored = [c for c in committed if isinstance(c.marker.get("metric", {}).get(metric), (int, float))]
    return sorted(scored, key=lambda c: c.marker["metric"][metric], reverse=mode == "max")


def best_checkpoint(root: Path, metric: str | None, mode: str = "max") -> Committed | None:
    """The committed checkpoint with the best validation `metric` in its marker, or None if none holds it."""
    if not metric:
        return None
    ranked = by_score(committed_checkpoints(root, warn=False), metric, mode)
    return ranked[0] if ranked else None
