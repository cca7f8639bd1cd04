"""COCO <-> YOLO (Ultralytics layout), for jobs of other frameworks.

YOLO layout: OUT/images/<name>, OUT/labels/<stem>.txt with one `class cx cy w h`
line per box (normalised to [0, 1], class 0..K-1 in COCO category-id order) and
OUT/data.yaml (`path`, `train`, `val`, `names`). data.yaml also keeps the COCO
category ids (`coco_category_ids`) and OUT/coco_image_ids.json the image ids, so
YOLO -> COCO restores both exactly. A train and a val split are written as
images/{train,val} and labels/{train,val}, and read back one JSON per split.
Images are hard-linked when the file system allows it, else copied.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import yaml
from PIL import Image

from musubi.contract.errors import ConfigError
from musubi.data.coco import check_relative_name, read_annotation_json
from musubi.data.coco_scan import BLOCKING, scan_entries, scan_references

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


#: Sidecar of OUT (YOLO) keeping each split's COCO image ids by file name, so YOLO -> COCO restores them.
IDS_FILE = "coco_image_ids.json"


def _checked(annotations: Path) -> dict[str, Any]:
    """The COCO file, refused in one line when an entry is malformed or refers to nothing (as `data check`)."""
    raw = read_annotation_json(annotations)
    malformed, kept = scan_entries(raw, annotations)
    found = {**malformed, **{k: v for k, v in scan_references(kept).items() if k in BLOCKING}}
    bad = [(k, v) for k, v in found.items() if v]
    if bad:
        total = sum(len(v) for _, v in bad)
        raise ConfigError(f"{annotations}: {total} malformed or dangling entries ({bad[0][0]}: {bad[0][1][0]}); "
                          f"run `musubi data check {annotations}` and fix them")
    return raw


def _clip(bbox: list[Any], w_img: int, h_img: int) -> tuple[tuple[float, float, float, float] | None, bool]:
    """The box clipped to the image (None when nothing of it is left) and whether clipping changed it."""
    x, y, w, h = (float(v) for v in bbox)
    x1, y1 = min(max(x, 0.0), w_img), min(max(y, 0.0), h_img)
    x2, y2 = min(max(x + w, 0.0), w_img), min(max(y + h, 0.0), h_img)
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)) or w <= 0 or h <= 0 or x2 <= x1 or y2 <= y1:
        return None, False
    return (x1, y1, x2 - x1, y2 - y1), (x1, y1, x2, y2) != (x, y, x + w, y + h)


def coco_to_yolo(annotations: Path, image_dir: Path, out: Path,
                 val: tuple[Path, Path] | None = None) -> dict[str, int]:
    """Write the YOLO layout of a COCO set (and of its val split); returns counts.

    Boxes are clipped to their image (YOLO tools refuse coordinates outside [0, 1]) and boxes with no
    area left are dropped: both counted (`clipped`, `dropped`). Two images that would share a label
    file (x.jpg, x.png) are refused before anything is written. With `val`, the layout is
    images/{train,val} + labels/{train,val}; the COCO image ids are kept in coco_image_ids.json.
    """
    splits = {"train": (Path(annotations), Path(image_dir))}
    if val is not None:
        splits["val"] = (Path(val[0]), Path(val[1]))
    raws = {k: _checked(ann) for k, (ann, _) in splits.items()}
    first = raws["train"]
    categories = sorted(c["id"] for c in first["categories"])
    names = {c["id"]: str(c.get("name", c["id"])) for c in first["categories"]}
    for k, raw in raws.items():
        if sorted(c["id"] for c in raw["categories"]) != categories:
            raise ConfigError(f"{splits[k][0]}: categories differ from {splits['train'][0]}; "
                              "use the same categories in every split")
    cls_of = {cid: n for n, cid in enumerate(categories)}
    out = Path(out)
    counts = {"images": 0, "boxes": 0, "crowd_skipped": 0, "clipped": 0, "dropped": 0}
    plans: list[tuple[Path, Path, str]] = []  # (source image, destination image, label text)
    ids: dict[str, dict[str, int]] = {}
    for split, (ann, images_dir) in splits.items():
        sub = Path(split) if val is not None else Path()
        raw = raws[split]
        images = {img["id"]: img for img in raw["images"]}
        label_of: dict[str, str] = {}
        for image_id, img in images.items():
            name = check_relative_name(img.get("file_name"), ann, image_id)
            label = (sub / Path(name).with_suffix(".txt")).as_posix()
            if label in label_of:
                raise ConfigError(f"{ann}: {name!r} and {label_of[label]!r} would share labels/{label}; "
                                  "rename one of them (nothing written)")
            label_of[label] = name
        missing = [n for n in label_of.values() if not (images_dir / n).is_file()]
        if missing:
            raise ConfigError(f"{ann}: {len(missing)} listed images are missing from {images_dir} (first: "
                              f"{missing[0]!r}); run `musubi data check` and fix the set (nothing written)")
        lines: dict[Any, list[str]] = {i: [] for i in images}
        for a in raw["annotations"]:
            img = images[a["image_id"]]
            if a.get("iscrowd", 0):
                counts["crowd_skipped"] += 1  # YOLO has no crowd regions
                continue
            w_img, h_img = img.get("width"), img.get("height")
            if not w_img or not h_img:
                with Image.open(images_dir / img["file_name"]) as im:
                    w_img, h_img = im.size
                    img["width"], img["height"] = w_img, h_img
            box, clipped = _clip(a["bbox"], w_img, h_img)
            if box is None:
                counts["dropped"] += 1
                continue
            counts["clipped"] += clipped
            x, y, w, h = box
            lines[img["id"]].append(f"{cls_of[a['category_id']]} {(x + w / 2) / w_img:.8f} "
                                    f"{(y + h / 2) / h_img:.8f} {w / w_img:.8f} {h / h_img:.8f}")
        for image_id, img in images.items():
            name = img["file_name"]
            plans.append((images_dir / name, out / "images" / sub / name,
                          "".join(line + "\n" for line in lines[image_id])))
        ids[split] = {img["file_name"]: image_id for image_id, img in images.items()}
        counts["images"] += len(images)
        counts["boxes"] += sum(len(v) for v in lines.values())
    for src, dst, text in plans:
        _link_or_copy(src, dst)
        label = (out / "labels" / dst.relative_to(out / "images")).with_suffix(".txt")
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text(text, encoding="utf-8")
    data = {"path": str(out.resolve()),
            "train": "images/train" if val is not None else "images",
            "val": "images/val" if val is not None else "images",
            "names": {n: names[cid] for n, cid in enumerate(categories)},
            "coco_category_ids": categories}
    (out / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    (out / IDS_FILE).write_text(json.dumps(ids), encoding="utf-8")
    return counts


def yolo_splits(src: Path) -> tuple[dict[str, Any], dict[str, Path]]:
    """data.yaml of a YOLO set and its splits: {"train": images dir, "val": ...} (one entry when they agree)."""
    meta_path = src / "data.yaml"
    if not meta_path.is_file():
        raise ConfigError(f"{src}: no data.yaml; give the root of a YOLO data set (data.yaml, images/, labels/)")
    meta = yaml.safe_load(meta_path.read_text(encoding="utf-8")) or {}
    if not isinstance(meta, dict):
        raise ConfigError(f"{meta_path}: not a mapping; give a YOLO data.yaml (names, train, val)")
    dirs: dict[str, Path] = {}
    for split in ("train", "val", "test"):
        rel = meta.get(split)
        if isinstance(rel, str) and rel:
            d = (src / rel) if not Path(rel).is_absolute() else Path(rel)
            if d.resolve() not in {v.resolve() for v in dirs.values()}:
                dirs[split] = d
    if not dirs:
        dirs["train"] = src / "images"
    return meta, dirs


def yolo_to_coco(src: Path, out_json: Path) -> dict[str, Any]:
    """Read a YOLO layout (SRC/data.yaml, images, labels) and write COCO: OUT_JSON, or OUT/<split>.json.

    One split (train and val the same folder): OUT_JSON, or OUT/annotations.json when `out_json` does not end
    in .json (a folder). Several (images/train, images/val): `out_json` is a folder and each split is written
    to it as <split>.json. COCO image ids come back from coco_image_ids.json when the set was written by
    coco_to_yolo, else 1..N in file-name order.
    """
    src = Path(src)
    meta, dirs = yolo_splits(src)
    ids_path = src / IDS_FILE
    known_ids = json.loads(ids_path.read_text(encoding="utf-8")) if ids_path.is_file() else {}
    if len(dirs) == 1:
        split, image_root = next(iter(dirs.items()))
        known = known_ids.get(split) or known_ids.get("train") or {}
        doc = _yolo_split_to_coco(src, meta, image_root, known)
        # Not a .json name: a folder, and the file in it a name `musubi data check` and data.*.annotations read.
        target = Path(out_json) if Path(out_json).suffix.lower() == ".json" else Path(out_json) / "annotations.json"
        _write_coco(doc, target)
        return {"images": len(doc["images"]), "boxes": len(doc["annotations"]), "images_dir": str(image_root),
                "annotations": str(target)}
    if Path(out_json).suffix.lower() == ".json":
        raise ConfigError(f"{src}: has splits {', '.join(dirs)}; give --out FOLDER "
                          f"(writes {', '.join(f'FOLDER/{k}.json' for k in dirs)})")
    # Every split is read and checked before the first file is written: a bad val split leaves nothing.
    docs = {split: _yolo_split_to_coco(src, meta, image_root, known_ids.get(split) or {})
            for split, image_root in dirs.items()}
    total: dict[str, Any] = {"images": 0, "boxes": 0}
    for split, doc in docs.items():
        _write_coco(doc, Path(out_json) / f"{split}.json")
        total["images"] += len(doc["images"])
        total["boxes"] += len(doc["annotations"])
        total[f"{split}"] = f"{dirs[split]}::{Path(out_json) / f'{split}.json'}"
    return total


def _write_coco(doc: dict[str, Any], out_json: Path) -> None:
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(doc), encoding="utf-8")


def _yolo_split_to_coco(src: Path, meta: dict[str, Any], image_root: Path,
                        known_ids: dict[str, int]) -> dict[str, Any]:
    """One YOLO split as a COCO document (nothing written: the caller writes once every split is read)."""
    meta_path = src / "data.yaml"
    names = meta.get("names")
    if isinstance(names, list):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        raise ConfigError(f"{meta_path}: no 'names' list or mapping; add the class names")
    ids = meta.get("coco_category_ids") or [n + 1 for n in range(len(names))]
    if len(ids) != len(names):
        raise ConfigError(f"{meta_path}: coco_category_ids has {len(ids)} entries for {len(names)} names; fix it")
    if not image_root.is_dir():
        raise ConfigError(f"{image_root}: no such image folder (named in {meta_path}); fix data.yaml")
    # Ultralytics finds labels by replacing the last /images/ of an image path with /labels/.
    label_root = src / "labels" / image_root.relative_to(src / "images") if image_root.is_relative_to(
        src / "images") else image_root.parent / "labels"
    files = sorted(p for p in image_root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    rels = [p.relative_to(image_root).as_posix() for p in files]
    taken = {known_ids[r] for r in rels if isinstance(known_ids.get(r), int)}
    next_id = max(taken, default=0) + 1
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    for path, rel in zip(files, rels, strict=True):
        image_id = known_ids.get(rel)
        if not isinstance(image_id, int):
            image_id, next_id = next_id, next_id + 1
        with Image.open(path) as im:
            w_img, h_img = im.size
        images.append({"id": image_id, "file_name": rel, "width": w_img, "height": h_img})
        label = (label_root / rel).with_suffix(".txt")
        if not label.is_file():
            continue  # an image without a label file has no objects (YOLO convention)
        for ln, line in enumerate(label.read_text(encoding="utf-8").splitlines(), start=1):
            parts = line.split()
            if not parts:
                continue
            try:
                cls, cx, cy, w, h = int(parts[0]), *(float(v) for v in parts[1:5])
            except (ValueError, TypeError):
                raise ConfigError(f"{label}:{ln}: not 'class cx cy w h'; fix the line") from None
            if len(parts) != 5 or not 0 <= cls < len(ids):
                raise ConfigError(f"{label}:{ln}: class {parts[0]} or field count is wrong; fix the line")
            # Labels carry 8 decimals: round to 1/1000 px so integer COCO boxes come back as integers.
            bw, bh = round(w * w_img, 3), round(h * h_img, 3)
            x, y = round(cx * w_img - w * w_img / 2, 3), round(cy * h_img - h * h_img / 2, 3)
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": ids[cls],
                         "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0})
    categories = [{"id": cid, "name": str(names[n])} for n, cid in enumerate(ids)]
    return {"images": images, "annotations": anns, "categories": categories}
