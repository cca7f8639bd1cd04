"""Tiny COCO sets on disk for the data tests: real JPEG files with boxes, and ways to break them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from musubi.data.synthetic_files import SyntheticFiles, write_synthetic_coco


def small_set(root: Path, images: int = 3, width: int = 96, height: int = 64, objects: int = 4,
              seed: int = 0) -> Path:
    """root/images/frame_*.jpg + root/annotations.json (boxes 6..16 px); returns the annotation path."""
    return write_synthetic_coco(root, SyntheticFiles(images, width, height, 2, objects, 6, 16, seed), workers=1)


def edit(ann: Path, fn: Any) -> Path:
    """Rewrite the annotation JSON through `fn(data)` (which edits in place)."""
    data = json.loads(ann.read_text())
    fn(data)
    ann.write_text(json.dumps(data))
    return ann
