"""COCO <-> YOLO (Ultralytics layout), for jobs of other frameworks.

YOLO layout: OUT/images/<name>, OUT/labels/<stem>.txt with one `class cx cy w h`
line per box (normalised to [0, 1], class 0..K-1 in COCO category-id order) and
OUT/data.yaml (`path`, `train`, `val`, `names`). data.yaml also keeps the COCO
category ids (`coco_category_ids`), so YOLO -> COCO restores them exactly.
Images are hard-linked when the file system allows it, else copied.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml
from PIL import Image

from musubi.config.errors import ConfigError
from musubi.data.coco import check_relative_name, read_annotation_json

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def coco_to_yolo(annotations: Path, image_dir: Path, out: Path) -> dict[str, int]:
    """Write the YOLO layout of a COCO set; returns counts (images, boxes, crowd_skipped)."""
    raw = read_annotation_json(Path(annotations))
    categories = sorted(c["id"] for c in raw["categories"])
    cls_of = {cid: n for n, cid in enumerate(categories)}
    names = {c["id"]: str(c.get("name", c["id"])) for c in raw["categories"]}
    images = {img["id"]: img for img in raw["images"]}
    lines: dict[Any, list[str]] = {i: [] for i in images}
    crowd = 0
    for n, a in enumerate(raw["annotations"]):
        img = images.get(a.get("image_id"))
        if img is None or a.get("category_id") not in cls_of:
            raise ConfigError(f"{annotations}: annotations[{n}] has an unknown image or category; "
                              "run `musubi data check` and fix it")
        if a.get("iscrowd", 0):
            crowd += 1  # YOLO has no crowd regions
            continue
        w_img, h_img = img.get("width"), img.get("height")
        if not w_img or not h_img:
            with Image.open(Path(image_dir) / img["file_name"]) as im:
                w_img, h_img = im.size
                img["width"], img["height"] = w_img, h_img
        x, y, w, h = (float(v) for v in a["bbox"])
        lines[img["id"]].append(f"{cls_of[a['category_id']]} {(x + w / 2) / w_img:.8f} {(y + h / 2) / h_img:.8f} "
                                f"{w / w_img:.8f} {h / h_img:.8f}")
    out = Path(out)
    for image_id, img in images.items():
        name = check_relative_name(img.get("file_name"), Path(annotations), image_id)
        _link_or_copy(Path(image_dir) / name, out / "images" / name)
        label = (out / "labels" / name).with_suffix(".txt")
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text("".join(line + "\n" for line in lines[image_id]), encoding="utf-8")
    data = {"path": str(out.resolve()), "train": "images", "val": "images",
            "names": {n: names[cid] for n, cid in enumerate(categories)},
            "coco_category_ids": categories}
    (out / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return {"images": len(images), "boxes": sum(len(v) for v in lines.values()), "crowd_skipped": crowd}


def yolo_to_coco(src: Path, out_json: Path) -> dict[str, int]:
    """Read a YOLO layout (SRC/data.yaml, SRC/images, SRC/labels) and write a COCO annotation file."""
    src = Path(src)
    meta_path = src / "data.yaml"
    if not meta_path.is_file():
        raise ConfigError(f"{src}: no data.yaml; give the root of a YOLO data set (data.yaml, images/, labels/)")
    meta = yaml.safe_load(meta_path.read_text(encoding="utf-8")) or {}
    names = meta.get("names")
    if isinstance(names, list):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        raise ConfigError(f"{meta_path}: no 'names' list or mapping; add the class names")
    ids = meta.get("coco_category_ids") or [n + 1 for n in range(len(names))]
    if len(ids) != len(names):
        raise ConfigError(f"{meta_path}: coco_category_ids has {len(ids)} entries for {len(names)} names; fix it")
    image_root = src / "images"
    files = sorted(p for p in image_root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    for image_id, path in enumerate(files, start=1):
        rel = path.relative_to(image_root)
        with Image.open(path) as im:
            w_img, h_img = im.size
        images.append({"id": image_id, "file_name": rel.as_posix(), "width": w_img, "height": h_img})
        label = (src / "labels" / rel).with_suffix(".txt")
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
            bw, bh = w * w_img, h * h_img
            x, y = cx * w_img - bw / 2, cy * h_img - bh / 2
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": ids[cls],
                         "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0})
    categories = [{"id": cid, "name": str(names[n])} for n, cid in enumerate(ids)]
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps({"images": images, "annotations": anns, "categories": categories}),
                              encoding="utf-8")
    return {"images": len(images), "boxes": len(anns)}
