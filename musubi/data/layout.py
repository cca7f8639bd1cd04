"""Where a data set's files are: the layout of a folder (COCO, YOLO or image classes) and a COCO file's images.

One rule for `musubi data check`, slice, convert, hash and watch, and for the version recorded for a job:
the data reader of preflight, the hash and the YOLO converter all read a folder through it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from musubi.contract.errors import ConfigError

#: Separates an explicit image directory from its annotation file: IMAGES_DIR::ANN.json.
PAIR_SEPARATOR = "::"


def find_image_dir(ann: Path, file_names: Iterable[str]) -> tuple[Path | None, list[Path]]:
    """The image directory of a COCO file: the candidate holding most of its first images, and all tried."""
    stem = ann.stem.removeprefix("instances_")
    root = ann.parent.parent if ann.parent.name == "annotations" else ann.parent
    candidates = [ann.parent / "images", root / stem, root / "images" / stem, root / "images", ann.parent]
    tried = list(dict.fromkeys(c for c in candidates))
    sample = [n for _, n in zip(range(20), file_names, strict=False)]  # the first 20
    if not sample:  # no images listed: any existing candidate will do
        return next((c for c in tried if c.is_dir()), None), tried
    best, best_hits = None, 0
    for c in tried:
        if c.is_dir():
            hits = sum((c / n).is_file() for n in sample)
            if hits > best_hits:
                best, best_hits = c, hits
    return best, tried


#: Files that mark a folder as a YOLO data set.
YOLO_MARKERS = ("data.yaml", "dataset.yaml")


def annotation_jsons(root: Path) -> list[Path]:
    """COCO annotation candidates of a folder: ROOT/*.json and ROOT/annotations/*.json (hidden files skipped)."""
    found = sorted(root.glob("*.json")) + sorted(root.glob("annotations/*.json"))
    # coco_image_ids.json: the image-id sidecar `data convert --to yolo` writes next to data.yaml.
    return [p for p in found if not p.name.startswith(".") and p.name != "coco_image_ids.json" and _looks_coco(p)]


#: JSON files larger than this are taken as COCO without looking (a data folder's big JSON is its annotations).
SNIFF_BYTES = 1 << 20


def _looks_coco(path: Path) -> bool:
    """Whether a JSON file may be COCO annotations: it names "images", "annotations" or "categories" (a
    class-folder set's `classes.json` does not make the folder COCO; a COCO file missing a list does, and
    the check names what is missing)."""
    try:
        if path.stat().st_size > SNIFF_BYTES:
            return True
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # unreadable: let the reader name the problem
    return any(f'"{k}"' in text for k in ("images", "annotations", "categories"))


def folder_layout(root: Path, several: bool = False) -> tuple[str, list[Path]]:
    """What a data set folder is: ("coco", [ANN.json, ...]), ("yolo", [data.yaml]) or ("folder", []).

    One rule for check, slice, convert, hash and watch. A folder holding both a COCO JSON and a YOLO
    layout, or (unless `several`) more than one JSON, is ambiguous: ConfigError naming the fix.
    """
    jsons = annotation_jsons(root)
    yamls = [root / n for n in YOLO_MARKERS if (root / n).is_file()]
    if jsons and (yamls or (root / "labels").is_dir()):
        raise ConfigError(f"{root}: holds both COCO JSON ({jsons[0].name}) and a YOLO layout (data.yaml/labels); "
                          f"give ANN.json or IMAGES_DIR{PAIR_SEPARATOR}ANN.json")
    if len(jsons) > 1 and not several:
        names = ", ".join(str(p.relative_to(root)) for p in jsons[:4])
        raise ConfigError(f"{root}: holds {len(jsons)} annotation JSON files ({names}); "
                          f"give one of them as ANN.json or IMAGES_DIR{PAIR_SEPARATOR}ANN.json")
    if jsons:
        return "coco", jsons
    if yamls:
        return "yolo", yamls[:1]
    return "folder", []
