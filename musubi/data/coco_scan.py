"""The entries of a COCO file a loader would refuse or silently double, listed per kind and offender.

`musubi data check` reports them all; YOLO conversion refuses a file that has any of them. Reads the parsed
JSON only (no image is opened).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError, split_error

#: Reference problems that make musubi.data.coco refuse the file (reported per offender instead).
BLOCKING = ("duplicate_image_id", "unknown_image", "unknown_category")


def is_int(v: Any) -> bool:
    """Whether a JSON value is an integer (JSON booleans are not)."""
    return isinstance(v, int) and not isinstance(v, bool)


def json_key(v: Any) -> Any:
    """A hashable stand-in for a JSON value (a malformed id may be a list or an object)."""
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


def _duplicates(values: list[Any]) -> list[Any]:
    seen: set[Any] = set()
    return [v for v in values if v in seen or seen.add(v)]  # type: ignore[func-returns-value]


def scan_references(raw: dict[str, Any], index_of: dict[int, int] | None = None) -> dict[str, list[str]]:
    """Problems of ids and references a loader would refuse or silently double: one list of offenders per kind.

    `index_of`: id(annotation) -> its index in the file, when `raw` is a filtered copy (scan_entries).
    """
    images = [img for img in raw["images"] if isinstance(img, dict)]
    anns = [a for a in raw["annotations"] if isinstance(a, dict)]
    image_ids = {json_key(img.get("id")) for img in images}
    category_ids = {json_key(c.get("id")) for c in raw["categories"] if isinstance(c, dict)}

    def at(n: int, a: Any) -> int:
        return index_of.get(id(a), n) if index_of else n

    return {
        "duplicate_image_id": [f"image id {i}" for i in _duplicates([json_key(img.get("id")) for img in images])],
        "duplicate_annotation_id": [f"annotation id {i}" for i in _duplicates([json_key(a.get("id")) for a in anns])
                                    if i is not None],
        "duplicate_file_name": [str(n) for n in _duplicates([json_key(img.get("file_name")) for img in images])],
        "unknown_image": [f"annotations[{at(n, a)}] image_id {a.get('image_id')!r}"
                          for n, a in enumerate(raw["annotations"])
                          if isinstance(a, dict) and json_key(a.get("image_id")) not in image_ids],
        "unknown_category": [f"annotations[{at(n, a)}] category_id {a.get('category_id')!r}"
                             for n, a in enumerate(raw["annotations"])
                             if isinstance(a, dict) and json_key(a.get("category_id")) not in category_ids],
    }


def scan_entries(raw: dict[str, Any], ann: Path) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Malformed entries the loader would refuse, one list per kind, and the file without them.

    Every offender is listed (the loader stops at the first); the remaining entries go on to the
    loader's own rules, the image decode and the box checks, so one bad entry hides nothing else.
    """
    from musubi.data.coco import check_relative_name  # imports torch: only when a file is scanned

    found: dict[str, list[str]] = {"bad_category_entry": [], "duplicate_category_id": [], "bad_image_entry": [],
                                   "bad_file_name": [], "bad_annotation_entry": [], "bad_bbox": []}
    cats: list[Any] = []
    seen_cat: set[Any] = set()
    for n, c in enumerate(raw["categories"]):
        if not isinstance(c, dict) or not is_int(c.get("id")):
            found["bad_category_entry"].append(f"categories[{n}] has no integer 'id'")
        elif c["id"] in seen_cat:
            found["duplicate_category_id"].append(f"categories[{n}] id {c['id']}")
        else:
            seen_cat.add(c["id"])
            cats.append(c)
    images: list[Any] = []
    for n, img in enumerate(raw["images"]):
        if not isinstance(img, dict) or not is_int(img.get("id")):
            found["bad_image_entry"].append(f"images[{n}] has no integer 'id'")
            continue
        try:
            check_relative_name(img.get("file_name"), ann, img["id"])
        except ConfigError as e:
            found["bad_file_name"].append(f"images[{n}]: {split_error(str(e))[0].split(': ', 1)[-1]}")
            continue
        images.append(img)
    anns: list[Any] = []
    for n, a in enumerate(raw["annotations"]):
        if not isinstance(a, dict):
            found["bad_annotation_entry"].append(f"annotations[{n}] is not an object")
            continue
        bbox = a.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox):
            found["bad_bbox"].append(f"annotations[{n}] bbox {bbox!r} is not [x, y, w, h] numbers")
            continue
        anns.append(a)
    return found, {**raw, "categories": cats, "images": images, "annotations": anns}
