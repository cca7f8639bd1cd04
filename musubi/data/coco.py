"""COCO-format detection data: an image directory plus an annotation JSON.

Everything that can be wrong with the annotation file is found at construction
(one-line ConfigError naming the file and the fix), so a worker never dies on
sample 40 000. Category ids map to contiguous labels 1..K in id order (0 is the
background class of torchvision detectors). Crowd regions are skipped and
degenerate boxes dropped; both are counted in `stats` and logged once.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms.functional import pil_to_tensor

from musubi.data import guards
from musubi.data.classmap import ClassMap, apply_class_map
from musubi.data.coco_file import check_relative_name, read_annotation_json
from musubi.data.coco_file import coco_error as _fail
from musubi.data.single_channel import SINGLE_CHANNEL_MODES, read_single_channel

log = logging.getLogger(__name__)

#: Pixel limit used when PIL's own decompression-bomb limit has been switched off (PIL's default).
DEFAULT_MAX_IMAGE_PIXELS = guards.DEFAULT_MAX_IMAGE_PIXELS


@dataclass(frozen=True)
class CocoStats:
    """What construction kept and dropped (reported, never silent)."""

    images: int
    annotations: int
    boxes: int
    crowd_skipped: int
    degenerate_dropped: int


def _is_int(value: Any) -> bool:
    return guards.is_id(value)  # an int64: ids become tensors


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _category_ids(data: dict[str, Any], ann_path: Path) -> list[int]:
    ids: list[int] = []
    for n, cat in enumerate(data["categories"]):
        if not isinstance(cat, dict) or not _is_int(cat.get("id")):
            raise _fail(ann_path, f"categories[{n}] has no integer 'id'", "fix the category entry")
        ids.append(cat["id"])
    if len(set(ids)) != len(ids):
        raise _fail(ann_path, "duplicate category ids", "give each category a unique id")
    return sorted(ids)


class CocoDetection(Dataset):
    """Map-style COCO set: index -> (image float [3, H, W] in [0, 1], {"boxes", "labels", "image_id"})."""

    def __init__(
        self,
        image_dir: str | os.PathLike[str],
        annotations: str | os.PathLike[str],
        *,
        image_size: int | None = None,
        category_ids: Sequence[int] | None = None,
        check_files: bool = True,
        max_image_pixels: int | None = None,
        as_uint8: bool = False,
        raw: dict[str, Any] | None = None,
        encoded: bool = False,
        classes: ClassMap | None = None,
        channels: int = 3,
    ) -> None:
        """Read and validate the annotations; `category_ids` fixes the label map (pass the train split's to val).

        `as_uint8`: images come as uint8 (4x fewer bytes through pinned memory; the task converts on the
        device). `raw`: the annotation file already parsed (by the data check), so it is not read twice.
        `encoded`: images come as the file's bytes (uint8 [N]) for decoding on the device
        (musubi.data.gpu_decode: nvJPEG, other formats on the host), boxes in file pixels. `classes`: a class
        map (data.classes) applied to the categories and boxes as they are read (musubi.data.classmap).
        `channels` 1: frames are read single-channel without loss (musubi.data.single_channel) as float32 [1, H, W]
        in their stored units (`as_uint8` does not apply: a 16-bit value does not fit in a byte).
        """
        self.image_dir = Path(image_dir)
        self.annotations = Path(annotations)
        self.image_size = image_size
        self.max_image_pixels = max_image_pixels
        self.as_uint8 = as_uint8
        self.encoded = encoded
        self.channels = channels
        data = raw if raw is not None else read_annotation_json(self.annotations)
        if not self.image_dir.is_dir():
            raise _fail(
                self.image_dir,
                "image directory not found",
                "fix data.*.path to the folder holding the images",
            )
        own_ids = _category_ids(data, self.annotations)
        if classes:
            data = apply_class_map(data, classes, self.annotations)
            own_ids = _category_ids(data, self.annotations)
        #: Sorted COCO category ids; label = position + 1.
        self.category_ids: tuple[int, ...] = (
            tuple(category_ids) if category_ids is not None else tuple(own_ids)
        )
        names = {c["id"]: str(c.get("name", c["id"])) for c in data["categories"]}
        self.category_names: dict[int, str] = {cid: names.get(cid, str(cid)) for cid in self.category_ids}
        label_of = {cid: n + 1 for n, cid in enumerate(self.category_ids)}
        self._load_images(data["images"])
        self._load_boxes(data["annotations"], label_of)
        if check_files:
            self._check_files()
        if self.stats.crowd_skipped or self.stats.degenerate_dropped:
            log.warning(
                "%s: skipped %d crowd annotations, dropped %d degenerate boxes (w<=0 or h<=0 after clipping)",
                self.annotations,
                self.stats.crowd_skipped,
                self.stats.degenerate_dropped,
            )

    @property
    def num_classes(self) -> int:
        """Object classes, excluding background."""
        return len(self.category_ids)

    def _load_images(self, images: list[Any]) -> None:
        entries: list[tuple[int, str, int, int]] = []
        for n, img in enumerate(images):
            if not isinstance(img, dict) or not _is_int(img.get("id")):
                raise _fail(self.annotations, f"images[{n}] has no integer 'id'", "fix the image entry")
            name = check_relative_name(img.get("file_name"), self.annotations, img["id"])
            # Width/height are optional in the wild; 0 means "unknown, do not clip at load".
            w, h = img.get("width", 0), img.get("height", 0)
            entries.append((img["id"], name, w if _is_int(w) else 0, h if _is_int(h) else 0))
        entries.sort()
        ids = [e[0] for e in entries]
        if len(set(ids)) != len(ids):
            raise _fail(self.annotations, "duplicate image ids", "give each image a unique id")
        self._image_ids = ids
        self._file_names = [e[1] for e in entries]
        self._declared_sizes = [(e[2], e[3]) for e in entries]

    def _load_boxes(self, annotations: list[Any], label_of: dict[int, int]) -> None:
        index_of = {image_id: n for n, image_id in enumerate(self._image_ids)}
        per_image: list[list[tuple[float, float, float, float, int]]] = [[] for _ in self._image_ids]
        crowd = degenerate = 0
        for n, ann in enumerate(annotations):
            if not isinstance(ann, dict):
                raise _fail(
                    self.annotations, f"annotations[{n}] is not an object", "fix the annotation entry"
                )
            image_id, category_id = ann.get("image_id"), ann.get("category_id")
            image = index_of.get(image_id) if _is_int(image_id) else None
            if image is None:
                raise _fail(
                    self.annotations,
                    f"annotations[{n}] refers to unknown image_id {image_id!r}",
                    "add the image or remove the annotation",
                )
            label = label_of.get(category_id) if _is_int(category_id) else None
            if label is None:
                raise _fail(
                    self.annotations,
                    f"annotations[{n}] has category_id {category_id!r}, not one of the {len(label_of)} known categories",
                    "use the same categories as the training split",
                )
            bbox = ann.get("bbox")
            if not isinstance(bbox, list) or len(bbox) != 4 or not all(_is_number(v) for v in bbox):
                raise _fail(
                    self.annotations, f"annotations[{n}] bbox is not [x, y, w, h]", "fix the annotation entry"
                )
            if ann.get("iscrowd", 0):
                crowd += 1
                continue
            x, y, w, h = (float(v) for v in bbox)
            x1, y1, x2, y2 = x, y, x + w, y + h
            width, height = self._declared_sizes[image]
            if width > 0 and height > 0:
                x1, x2 = min(max(x1, 0.0), width), min(max(x2, 0.0), width)
                y1, y2 = min(max(y1, 0.0), height), min(max(y2, 0.0), height)
            if not all(math.isfinite(v) for v in (x1, y1, x2, y2)) or x2 <= x1 or y2 <= y1:
                degenerate += 1
                continue
            per_image[image].append((x1, y1, x2, y2, label))
        counts = [len(rows) for rows in per_image]
        flat = [row for rows in per_image for row in rows]
        # One flat table + offsets: cheap to pickle into loader workers, unlike 100k small tensors.
        table = torch.tensor(flat, dtype=torch.float64).reshape(-1, 5)
        self._boxes = table[:, :4].to(torch.float32)
        self._labels = table[:, 4].to(torch.int64)
        self._offsets = torch.tensor([0, *counts], dtype=torch.int64).cumsum(0)
        self.stats = CocoStats(
            images=len(self._image_ids),
            annotations=len(annotations),
            boxes=len(flat),
            crowd_skipped=crowd,
            degenerate_dropped=degenerate,
        )

    def _check_files(self) -> None:
        missing = [name for name in self._file_names if not (self.image_dir / name).is_file()]
        for name in self._file_names if not missing else ():
            guards.inside(self.image_dir, self.image_dir / name)  # no symlink out of the data set
        if missing:
            raise _fail(
                self.image_dir,
                f"{len(missing)} of {len(self._file_names)} images listed in {self.annotations} are missing "
                f"(first: {missing[0]!r})",
                "fix data.*.path or the annotation file",
            )

    def __len__(self) -> int:
        return len(self._image_ids)

    def file_size(self, index: int) -> tuple[int, int]:
        """(width, height) of image `index` as stored (the pixels its annotation boxes refer to), from its header."""
        with Image.open(self.image_dir / self._file_names[index]) as im:
            return im.size

    def stored_range(self, sample: int = 8) -> tuple[float, float] | None:
        """The range of the single-channel frames' stored type (0..255, 0..65535; the widest of up to `sample`
        frames spread over the set, read from their headers), or None for signed and float frames."""
        n = len(self._file_names)
        widest = 0.0
        for i in sorted({k * n // sample for k in range(sample)} if n else ()):
            with Image.open(self.image_dir / self._file_names[i]) as im:
                dtype = SINGLE_CHANNEL_MODES.get(im.mode)
            if dtype not in (np.uint8, np.uint16):
                return None
            widest = max(widest, float(np.iinfo(dtype).max))
        return (0.0, widest) if widest else None

    def most_boxes(self) -> int:
        """The most boxes any one image holds (0 without boxes): what a detector must return to score them all."""
        counts = self._offsets[1:] - self._offsets[:-1]
        return int(counts.max()) if len(counts) else 0

    def jpeg_share(self) -> float:
        """Share of the images whose file name says JPEG (what `data.gpu_decode: auto` decides on)."""
        names = self._file_names
        return sum(Path(n).suffix.lower() in (".jpg", ".jpeg") for n in names) / max(1, len(names))

    def read_bytes(self, index: int) -> Tensor:
        """The file bytes of image `index` (uint8 [N]), for decoding on the device."""
        path = self.image_dir / self._file_names[index]
        guards.inside(self.image_dir, path)
        # Read, not mapped (torchvision's read_file maps the file): a loader worker cannot pass a file-mapped
        # storage to the main process (torch takes it for shared memory and dups a closed fd: EBADF, on 4x H200).
        return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)

    def _open(self, path: Path) -> Image.Image:
        guards.inside(self.image_dir, path)
        return guards.open_image(path, self.max_image_pixels)

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Tensor]]:
        path = self.image_dir / self._file_names[index]
        lo, hi = int(self._offsets[index]), int(self._offsets[index + 1])
        boxes = self._boxes[lo:hi].clone()
        labels = self._labels[lo:hi].clone()
        image_id = torch.tensor(self._image_ids[index], dtype=torch.int64)
        if self.encoded:
            return self.read_bytes(index), {"boxes": boxes, "labels": labels, "image_id": image_id}
        if self.channels == 1:
            image = self._single_channel(path, boxes)
            keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
            return image, {"boxes": boxes[keep], "labels": labels[keep], "image_id": image_id}
        im = self._open(path)
        if self.image_size is not None:
            scale = self.image_size / max(im.width, im.height)
            new_w, new_h = max(1, round(im.width * scale)), max(1, round(im.height * scale))
            # Scale per axis by the realised size so boxes follow the rounding of the resize.
            boxes *= torch.tensor([new_w / im.width, new_h / im.height] * 2, dtype=torch.float32)
            im = im.resize((new_w, new_h), Image.Resampling.BILINEAR)
        # Clip to the real image (declared width/height may be absent or wrong) and drop what vanished.
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, im.width)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, im.height)
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        image = pil_to_tensor(im)
        if not self.as_uint8:
            image = image.to(torch.float32).div_(255.0)
        target = {
            "boxes": boxes[keep],
            "labels": labels[keep],
            "image_id": image_id,
        }
        return image, target

    def _single_channel(self, path: Path, boxes: Tensor) -> Tensor:
        """float32 [1, H, W] in stored units (resized to image_size when set); `boxes` scaled and clipped in place."""
        guards.inside(self.image_dir, path)
        image = torch.from_numpy(read_single_channel(path, self.max_image_pixels).astype("float32"))[None]
        h, w = image.shape[1:]
        if self.image_size is not None:
            scale = self.image_size / max(w, h)
            new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
            boxes *= torch.tensor([new_w / w, new_h / h] * 2, dtype=torch.float32)
            # Bilinear with antialias, as PIL's resize of the RGB path; values stay in stored units.
            image = F.interpolate(image[None], size=(new_h, new_w), mode="bilinear", align_corners=False,
                                  antialias=True)[0]
            h, w = new_h, new_w
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
        return image
