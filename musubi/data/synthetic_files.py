"""A synthetic large-image detection set written as real JPEG files plus a COCO annotation file.

Small objects on big frames (the drone case): a 4000x3000 frame with 20 px
objects, so the loader pays real JPEG decoding and the slicer has work to do.
Image `i` is a pure function of (seed, i), so two writers produce the same
bytes and a test can rebuild any frame. Colours follow the class as in
`synthetic_detection` (learnable, seed independent).

`thermal=True` writes the thermal-infrared variant: single-channel 16-bit (or 8-bit) PNG or TIFF
frames in a radiometric scale (TLinear, centikelvin: 29315 is 20 C), a cool background with a
gentle gradient and warm objects whose temperature follows their class.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from musubi.contract.errors import ConfigError

#: Where `write_synthetic_coco` puts things inside OUT.
IMAGE_DIR = "images"
ANNOTATIONS = "annotations.json"


@dataclass(frozen=True)
class SyntheticFiles:
    """Parameters of a generated set (all images share one size)."""

    images: int = 16
    width: int = 1920
    height: int = 1080
    num_classes: int = 3
    objects: int = 12
    min_object: int = 12
    max_object: int = 48
    seed: int = 0
    quality: int = 90
    thermal: bool = False  # single-channel radiometric frames instead of RGB JPEG
    bits: int = 16  # thermal: 16 (centikelvin) or 8 (0..60 C mapped to 0..255)
    image_format: str = "png"  # thermal: png or tiff

    def check(self) -> None:
        """ConfigError when objects cannot fit inside the frame, or the thermal format is unknown."""
        if self.thermal and (self.bits not in (8, 16) or self.image_format not in ("png", "tiff")):
            raise ConfigError(f"synthetic thermal set: bits {self.bits} / format {self.image_format!r}: give "
                              "bits 8 or 16 and format png or tiff")
        if self.images < 1 or self.num_classes < 1 or self.objects < 0:
            raise ConfigError("synthetic set: images and classes must be >= 1, objects >= 0")
        if not 2 <= self.min_object <= self.max_object < min(self.width, self.height):
            raise ConfigError(
                f"synthetic set: need 2 <= min_object ({self.min_object}) <= max_object ({self.max_object}) "
                f"< frame side ({min(self.width, self.height)}); lower the object sizes or enlarge the frame"
            )


def _colours(num_classes: int) -> np.ndarray:
    """uint8 RGB per label 1..K (index 0 unused), the hues of synthetic_detection.class_colours."""
    import torch

    from musubi.data.synthetic_detection import class_colours

    rgb = class_colours(torch.arange(num_classes + 1)).numpy()
    return (rgb * 255).round().astype(np.uint8)


def draw_frame(p: SyntheticFiles, index: int) -> tuple[np.ndarray, list[tuple[int, int, int, int, int]]]:
    """One frame uint8 [H, W, 3] and its objects (x, y, w, h, label 1..K)."""
    rng = np.random.default_rng([p.seed, index])
    # Low-frequency background: a coarse colour grid upsampled by PIL (cheap even at 8000x8000).
    coarse = (rng.random((6, 8, 3)) * 100 + 50).astype(np.uint8)
    frame = np.asarray(Image.fromarray(coarse).resize((p.width, p.height), Image.Resampling.BILINEAR)).copy()
    colours = _colours(p.num_classes)
    objects = []
    for _ in range(p.objects):
        w, h = (int(v) for v in rng.integers(p.min_object, p.max_object + 1, size=2))
        x, y = int(rng.integers(0, p.width - w + 1)), int(rng.integers(0, p.height - h + 1))
        label = int(rng.integers(1, p.num_classes + 1))
        frame[y : y + h, x : x + w] = colours[label]
        objects.append((x, y, w, h, label))
    # Sensor-like noise on a small tile repeated: per-pixel noise on 12 Mpx would dominate generation time.
    noise = rng.integers(-6, 7, size=(64, 64, 3), dtype=np.int16)
    reps = (-(-p.height // 64), -(-p.width // 64), 1)
    frame = np.clip(frame.astype(np.int16) + np.tile(noise, reps)[: p.height, : p.width], 0, 255).astype(np.uint8)
    return frame, objects


#: Thermal frames: background and object temperatures in centikelvin (TLinear, as radiometric cameras write).
COOL_CK, WARM_CK, CLASS_STEP_CK = 29_315, 30_500, 600  # 20 C background; class k at 30500 + 600 k (~40 C and up)
#: 8-bit thermal frames map 0..60 C (27315..33315 cK) onto 0..255.
EIGHT_BIT_RANGE_CK = (27_315, 33_315)


def draw_thermal_frame(p: SyntheticFiles, index: int) -> tuple[np.ndarray, list[tuple[int, int, int, int, int]]]:
    """One thermal frame [H, W] (uint16 centikelvin, or uint8 at 8 bits) and its objects (x, y, w, h, label)."""
    rng = np.random.default_rng([p.seed, index, 1])
    # A smooth temperature field (ground warmed unevenly, +-3 K) upsampled from a coarse grid.
    coarse = Image.fromarray((rng.random((6, 8)) * 600 - 300).astype(np.float32), mode="F")
    frame = np.asarray(coarse.resize((p.width, p.height), Image.Resampling.BILINEAR), dtype=np.float64) + COOL_CK
    objects = []
    for _ in range(p.objects):
        w, h = (int(v) for v in rng.integers(p.min_object, p.max_object + 1, size=2))
        x, y = int(rng.integers(0, p.width - w + 1)), int(rng.integers(0, p.height - h + 1))
        label = int(rng.integers(1, p.num_classes + 1))
        frame[y : y + h, x : x + w] = WARM_CK + CLASS_STEP_CK * label
        objects.append((x, y, w, h, label))
    noise = rng.normal(0.0, 8.0, size=(64, 64))  # sensor noise (NETD ~0.08 K), a tile repeated as in RGB
    reps = (-(-p.height // 64), -(-p.width // 64))
    frame = frame + np.tile(noise, reps)[: p.height, : p.width]
    if p.bits == 8:
        lo, hi = EIGHT_BIT_RANGE_CK
        return np.clip(np.rint((frame - lo) * 255.0 / (hi - lo)), 0, 255).astype(np.uint8), objects
    return np.clip(np.rint(frame), 0, 65535).astype(np.uint16), objects


def _write_one(args: tuple[SyntheticFiles, int, str]) -> list[tuple[int, int, int, int, int]]:
    p, index, path = args
    if p.thermal:
        frame, objects = draw_thermal_frame(p, index)
        # uint16 -> mode I;16, uint8 -> L: both written single-channel at their own depth.
        Image.fromarray(frame).save(path, format=p.image_format.upper())
        return objects
    frame, objects = draw_frame(p, index)
    Image.fromarray(frame).save(path, format="JPEG", quality=p.quality)
    return objects


def write_synthetic_coco(out: Path, p: SyntheticFiles, workers: int | None = None) -> Path:
    """Write OUT/images/frame_00000.jpg (thermal: .png/.tif)... and OUT/annotations.json; returns the annotation path."""
    p.check()
    out = Path(out)
    (out / IMAGE_DIR).mkdir(parents=True, exist_ok=True)
    suffix = {"png": ".png", "tiff": ".tif"}[p.image_format] if p.thermal else ".jpg"
    names = [f"frame_{i:05d}{suffix}" for i in range(p.images)]
    jobs = [(p, i, str(out / IMAGE_DIR / n)) for i, n in enumerate(names)]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            per_image = list(pool.map(_write_one, jobs, chunksize=max(1, len(jobs) // (4 * workers))))
    else:
        per_image = [_write_one(j) for j in jobs]
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i, (name, objects) in enumerate(zip(names, per_image, strict=True)):
        images.append({"id": i + 1, "file_name": name, "width": p.width, "height": p.height})
        for x, y, w, h, label in objects:
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": label,
                                "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0})
    categories = [{"id": c, "name": f"class{c}"} for c in range(1, p.num_classes + 1)]
    ann = out / ANNOTATIONS
    ann.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}),
                   encoding="utf-8")
    return ann
