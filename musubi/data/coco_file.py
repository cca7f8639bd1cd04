"""A COCO annotation file read and checked as JSON, without torch: the keys it must have, its size bound, image
file names that stay inside the image directory. musubi/data/coco.py builds the data set on it; `musubi data hash`
and `check` read it alone."""

from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.data import guards

#: Largest annotation file read (bytes); COCO train2017 is ~0.45 GiB.
MAX_ANNOTATION_BYTES = 2 * 1024**3


def coco_error(path: Path, problem: str, fix: str) -> ConfigError:
    """`PATH: problem; fix` as a ConfigError."""
    return ConfigError(f"{path}: {problem}; {fix}")


def check_relative_name(file_name: Any, ann_path: Path, image_id: Any) -> str:
    """Return `file_name` if it stays inside the image directory, else raise ConfigError."""
    if not isinstance(file_name, str) or not file_name or "\x00" in file_name:
        raise coco_error(ann_path, f"image {image_id} has an empty or non-string file_name", "fix the entry")
    # Check both path flavours: a Windows-made file may say C:\.. or ..\x even when read on Linux.
    for flavour in (PurePosixPath, PureWindowsPath):
        p = flavour(file_name)
        if p.is_absolute() or p.drive or p.root or ".." in p.parts:
            raise coco_error(
                ann_path,
                f"image {image_id} file_name {file_name!r} escapes the image directory",
                "use a path relative to the image directory without '..'",
            )
    return file_name


def read_annotation_json(ann_path: Path) -> dict[str, Any]:
    """Parse a COCO annotation file after checking it exists, is bounded in size and has the COCO keys."""
    if not ann_path.is_file():
        raise coco_error(
            ann_path, "annotation file not found", "fix data.*.annotations to point at a COCO JSON file"
        )
    data = guards.load_json(ann_path, MAX_ANNOTATION_BYTES, "annotation file")
    if not isinstance(data, dict):
        raise coco_error(
            ann_path, "top level is not a JSON object", "give a COCO file with images/annotations/categories"
        )
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise coco_error(
                ann_path,
                f"missing the COCO list {key!r}",
                "give a COCO file with images, annotations and categories",
            )
    return data
