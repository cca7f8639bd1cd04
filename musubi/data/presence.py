"""Is a job's data where the job says, and how many samples does its train split hold? Answered without torch.

The launcher asks before anything is written, so a missing folder or a split too small for one batch per
rank is refused in well under a second; the task's own reading (which parses and decodes) comes later in
the same launch. Counts here are upper bounds (files by extension, COCO `images` entries): a refusal on
them is certain, a pass leaves the finer checks to the task.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from musubi.config.job import DataSpec, DataSplit, JobSpec
from musubi.contract.errors import ConfigError

#: Image files an image-folder class holds (torchvision's IMG_EXTENSIONS).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: COCO files larger than this are not parsed here only to count images (the task parses them once anyway).
COUNT_JSON_BYTES = 64 << 20


def _classification_split(split: DataSplit) -> None:
    root = Path(split.path)
    if not root.is_dir():
        raise ConfigError(f"data: {root}: no such directory; give an image-folder root (one folder per class)")
    if not any(p.is_dir() for p in root.iterdir()):
        raise ConfigError(f"data: {root}: no class folders inside; expected ROOT/CLASS/image.jpg")


def _detection_split(split: DataSplit, name: str) -> None:
    if split.annotations is None:
        raise ConfigError(f"data.{name}.annotations: detection needs a COCO annotation JSON for this split; set it")
    ann = Path(split.annotations)
    if not ann.is_file():
        raise ConfigError(f"{ann}: annotation file not found; fix data.*.annotations to point at a COCO JSON file")
    if not Path(split.path).is_dir():
        raise ConfigError(f"{split.path}: image directory not found; fix data.*.path to the folder holding the images")


def _text_split(split: DataSplit) -> None:
    if not Path(split.path).is_file():
        raise ConfigError(f"{split.path}: no such text file; give data.train.path / data.val.path of a UTF-8 file")


def check_paths(task: str, data: DataSpec) -> None:
    """ConfigError naming the first split whose folder or file is missing (built-in tasks; synthetic: nothing)."""
    for name in ("train", "val"):
        split = getattr(data, name)
        if split is None:
            continue
        if task == "classification":
            _classification_split(split)
        elif task == "detection":
            _detection_split(split, name)
        elif task == "lm":
            _text_split(split)


def _folder_images(root: Path) -> int:
    """Image files (by extension) in the class folders of an image-folder root."""
    count = 0
    for cls in root.iterdir():
        if cls.is_dir():
            for _, _, files in os.walk(cls, followlinks=True):
                count += sum(1 for f in files if f.lower().endswith(IMAGE_SUFFIXES))
    return count


def _coco_images(ann: Path) -> int | None:
    """Entries of a COCO file's `images` list (None when the file is large or not readable: the task says why)."""
    if ann.stat().st_size > COUNT_JSON_BYTES:
        return None
    try:
        data: Any = json.loads(ann.read_bytes())
    except (OSError, ValueError):
        return None
    images = data.get("images") if isinstance(data, dict) else None
    return len(images) if isinstance(images, list) else None


def train_samples(spec: JobSpec) -> int | None:
    """Samples of the train split, or None when it cannot be told cheaply (sliced frames, a user task)."""
    data = spec.data
    if spec.task not in ("classification", "detection", "lm"):
        return None  # a user task reads its own data (its `data:` may not describe it)
    if data.synthetic is not None:
        return data.synthetic.train_size
    split = data.train
    if split is None or data.slice is not None:
        return None
    if spec.task == "classification":
        return _folder_images(Path(split.path))
    if spec.task == "detection" and split.annotations is not None:
        return _coco_images(Path(split.annotations))
    if spec.task == "lm":
        return Path(split.path).stat().st_size // (data.seq_len + 1)
    return None


def check_train_size(spec: JobSpec, per_rank: int, ranks: int) -> None:
    """ConfigError when the train split cannot give every rank one full batch (the loader drops partial ones)."""
    samples = train_samples(spec)
    if samples is not None and samples // ranks < per_rank:
        raise ConfigError(f"data: the train split holds {samples} samples, less than one batch of {per_rank} per "
                          f"rank x {ranks} ranks = {per_rank * ranks}; lower train.batch or --nproc, or add data")
