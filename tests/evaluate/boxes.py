"""Sets of files and jobs for predict/edge tests, and the box-matching rule of issue 42's proof."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

#: Issue 42: every box matched at IoU >= 0.99 with the same class, scores within 1e-3. A box under a pixel wide
#: (an untrained detector emits some) has an IoU that float noise moves by percents: it also matches a box whose
#: every coordinate is within 0.01 px (torch and ONNX Runtime differ by ~1e-3 px there).
MIN_IOU, SCORE_TOL, COORD_TOL = 0.99, 1e-3, 0.01


def textured_set(root: Path, images: int = 4, width: int = 160, height: int = 120, thermal: bool = False) -> Path:
    """root/images (JPEG and PNG alternating; thermal: 16-bit PNG) + root/annotations.json with two named classes.

    Smooth random texture, so even an untrained detector answers differently from frame to frame.
    """
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    entries, anns = [], []
    for i in range(images):
        coarse = rng.random((height // 8, width // 8, 1 if thermal else 3))
        if thermal:  # centikelvin around 20 C, as musubi's thermal sets
            arr = (29000 + coarse[:, :, 0] * 800).astype(np.float32)
            im = Image.fromarray(arr, mode="F").resize((width, height), Image.Resampling.BICUBIC)
            im = Image.fromarray(np.asarray(im).astype(np.uint16))
            name = f"frame_{i}.png"
        else:
            im = Image.fromarray((coarse * 255).astype(np.uint8)).resize((width, height), Image.Resampling.BICUBIC)
            name = f"frame_{i}.{'png' if i % 2 else 'jpg'}"
        im.save(root / "images" / name)
        entries.append({"id": i + 1, "file_name": name, "width": width, "height": height})
        for k in range(3):
            x, y = float(rng.integers(0, width - 30)), float(rng.integers(0, height - 30))
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": (7, 3)[k % 2],
                         "bbox": [x, y, 24.0, 20.0], "area": 480.0, "iscrowd": 0})
    ann = root / "annotations.json"
    # ids 7 and 3: not positions, not in order; names the artefacts must carry
    ann.write_text(json.dumps({"images": entries, "annotations": anns,
                               "categories": [{"id": 7, "name": "car"}, {"id": 3, "name": "person"}]}))
    return ann


def _iou(a: list[float], b: list[float]) -> float:
    """IoU of two COCO [x, y, w, h] boxes."""
    ax2, ay2, bx2, by2 = a[0] + a[2], a[1] + a[3], b[0] + b[2], b[1] + b[3]
    iw = max(0.0, min(ax2, bx2) - max(a[0], b[0]))
    ih = max(0.0, min(ay2, by2) - max(a[1], b[1]))
    inter = iw * ih
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else float(a == b)


def _close(a: list[float], b: list[float]) -> bool:
    """Same box: IoU >= 0.99, or every coordinate within 0.01 px."""
    return _iou(a, b) >= MIN_IOU or max(abs(x - y) for x, y in zip(a, b, strict=True)) <= COORD_TOL


def unmatched(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], key: str = "file_name") -> list[str]:
    """Boxes of either list without a partner in the other (same image and class, _close, score within 1e-3);
    [] when both give the same boxes."""
    problems = []
    groups: dict[tuple[Any, Any], list[list[dict[str, Any]]]] = {}
    for side, rows in enumerate((ours, theirs)):
        for r in rows:
            groups.setdefault((r[key], r["category_id"]), [[], []])[side].append(r)
    for (image, cat), (a, b) in groups.items():
        free = list(b)
        for r in sorted(a, key=lambda r: -r["score"]):
            best = max(free, key=lambda o: _iou(r["bbox"], o["bbox"]) - abs(r["score"] - o["score"]), default=None)
            if best is None or not _close(r["bbox"], best["bbox"]) or abs(r["score"] - best["score"]) > SCORE_TOL:
                problems.append(f"{image} class {cat}: {r['bbox']} {r['score']} has no partner")
                continue
            free.remove(best)
        problems += [f"{image} class {cat}: {o['bbox']} {o['score']} only on the other side" for o in free]
    return problems
