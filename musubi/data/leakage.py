"""Leakage between splits: the same source frame, identical bytes or near-identical pictures on two sides.

A model scored on a tile whose neighbour (same frame, overlapping pixels) it trained
on, or on a re-encoded copy of a training image, reports a quality it will not have
on new data. Three signs are looked for across splits, never within one:

- same frame: tiles written by `musubi data slice` record their source frame
  (`frame_sha256`, else `frame_file` + `frame_id`);
- identical: the same bytes (sha256; only files of equal size are hashed);
- near-identical: a 16x16 grey thumbnail of each image (box-filtered, so JPEG
  noise averages out), with its mean removed and scaled to unit length; two
  images whose thumbnails have a cosine of NEAR_COSINE or more are the same
  picture (re-encoded, resized, a little brighter). Measured on tiles of the
  synthetic frames: such copies >= 0.993, tiles of other frames <= 0.952.
  Featureless images (thumbnail spread under FEATURELESS of the full scale: flat
  sky, water, padding) are not compared. Every pair across splits is compared
  (a matrix product in blocks: seconds for ten thousand images).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

#: Cosine of two thumbnails at or above which two images are the same picture.
NEAR_COSINE = 0.985
#: Thumbnail side (pixels).
THUMB = 16
#: Standard deviation of a thumbnail, as a fraction of the full scale, below which it is featureless.
FEATURELESS = 0.005
#: Rows of the similarity matrix computed at once (BLOCK x BLOCK float32: 64 MiB).
BLOCK = 4096


@dataclass(frozen=True)
class SplitImage:
    """One image of a split: where it is, its COCO id and the frame it was cut from (None: itself)."""

    split: str
    name: str  # file_name in the annotation file
    path: Path
    image_id: Any
    frame: str | None


def frame_key(entry: dict[str, Any]) -> str | None:
    """The source frame a `data slice` tile records (None: the image is a frame of its own)."""
    if isinstance(entry.get("frame_sha256"), str) and entry["frame_sha256"]:
        return "sha256:" + entry["frame_sha256"]
    if "frame_id" in entry:
        return f"{entry.get('frame_file', '')}#{entry['frame_id']}"
    return None


def split_images(split: str, raw: dict[str, Any], image_dir: Path) -> list[SplitImage]:
    """The listed images of a parsed COCO split that exist on disk."""
    out = []
    for entry in raw["images"]:
        name = entry.get("file_name") if isinstance(entry, dict) else None
        if isinstance(name, str) and (image_dir / name).is_file():
            out.append(SplitImage(split, name, image_dir / name, entry.get("id"), frame_key(entry)))
    return out


def thumbnail(path: Path) -> np.ndarray | None:
    """Unit-length, zero-mean 16x16 grey thumbnail [256] float32 (any mode and bit depth); None: featureless."""
    with Image.open(path) as im:
        if im.format == "JPEG":
            im.draft("L", (4 * THUMB, 4 * THUMB))  # a thumbnail is all this needs: decode at reduced scale
        if im.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
            pixels = np.asarray(im, dtype=np.float32)
            full = 65535.0 if im.mode.startswith("I;16") or pixels.max() > 255 else 255.0
            grey = Image.fromarray(pixels)  # mode F: keeps 16-bit detail ("L" would clip at 255)
        else:
            grey, full = im.convert("L"), 255.0
        small = np.asarray(grey.resize((THUMB, THUMB), Image.Resampling.BOX), dtype=np.float32).reshape(-1)
    small = small - small.mean()
    if small.std() < FEATURELESS * full:
        return None
    return small / np.linalg.norm(small)


def thumbnails(paths: list[Path]) -> list[np.ndarray | None]:
    """thumbnail per path (None also where the file does not decode: `data check` names it), on a thread pool."""

    def one(p: Path) -> np.ndarray | None:
        try:
            return thumbnail(p)
        except Exception:  # noqa: BLE001 - an unreadable image is reported by the decode check, not here
            return None

    if len(paths) < 32:
        return [one(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        return list(pool.map(one, paths))


def near_pairs(thumbs: list[np.ndarray | None], sides: list[str] | None = None,
               min_cosine: float = NEAR_COSINE) -> list[tuple[int, int, float]]:
    """(i, j, cosine) for every pair i < j of thumbnails at `min_cosine` or more (only across `sides` if given)."""
    index = [i for i, t in enumerate(thumbs) if t is not None]
    if len(index) < 2:
        return []
    m = np.stack([thumbs[i] for i in index])  # type: ignore[misc]  # [n, 256]
    side = np.array([sides[i] for i in index]) if sides is not None else None
    out = []
    for r0 in range(0, len(index), BLOCK):
        for c0 in range(r0, len(index), BLOCK):
            sim = m[r0 : r0 + BLOCK] @ m[c0 : c0 + BLOCK].T  # [rows, cols] cosines
            hit = sim >= min_cosine
            rows, cols = np.nonzero(hit)
            for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
                i, j = r0 + r, c0 + c
                if j <= i or (side is not None and side[i] == side[j]):
                    continue
                out.append((index[i], index[j], float(sim[r, c])))
    return out


def identical_pairs(images: list[SplitImage], store: Path | None = None) -> list[tuple[int, int]]:
    """(i, j) of images with the same bytes (each joined to the first of its digest); only equal sizes hashed."""
    from musubi.data.version import digests

    sizes: dict[int, list[int]] = {}
    for i, im in enumerate(images):
        sizes.setdefault(im.path.stat().st_size, []).append(i)
    shared = [i for group in sizes.values() if len(group) > 1 for i in group]
    sums, _ = digests([images[i].path for i in shared], store)
    first: dict[str, int] = {}
    out = []
    for i, d in zip(shared, sums, strict=True):
        if d in first:
            out.append((first[d], i))
        else:
            first[d] = i
    return out


@dataclass(frozen=True)
class Leaks:
    """Pairs of images on two sides of a split, one list of 'val/x = train/y' lines per kind."""

    same_frame: list[str]
    identical: list[str]
    near_identical: list[str]

    @property
    def count(self) -> int:
        """Leaking pairs of all kinds."""
        return len(self.same_frame) + len(self.identical) + len(self.near_identical)


def _where(im: SplitImage) -> str:
    return f"{im.split}/{im.name}"


def find_leaks(images: list[SplitImage], store: Path | None = None,
               thumbs: list[np.ndarray | None] | None = None, identical: bool = True) -> Leaks:
    """Every pair of images of different splits that shares a frame, its bytes or (nearly) its picture.

    `store`: musubi.db caching file digests; `thumbs`: the images' thumbnails when already computed;
    `identical`: False when the caller reports byte-identical pairs itself (those are then still not
    reported as near-identical).
    """
    same_frame: list[str] = []
    first_of: dict[str, SplitImage] = {}
    for im in images:
        if im.frame is None:
            continue
        other = first_of.setdefault(im.frame, im)
        if other.split != im.split:
            same_frame.append(f"{_where(im)} and {_where(other)} are tiles of one frame")
    same = [(i, j) for i, j in identical_pairs(images, store) if images[i].split != images[j].split] if identical else []
    same_bytes = set(same)
    if thumbs is None:
        thumbs = thumbnails([im.path for im in images])
    near = []
    for i, j, cos in near_pairs(thumbs, [im.split for im in images]):
        a, b = images[i], images[j]
        if (a.frame is not None and a.frame == b.frame) or (i, j) in same_bytes:
            continue  # named above as tiles of one frame or as the same bytes
        if not identical and cos > 0.99999 and a.path.stat().st_size == b.path.stat().st_size:
            continue  # the caller names byte-identical pairs; equal size and picture: taken as one of those
        near.append((i, j, cos))
    return Leaks(same_frame,
                 [f"{_where(images[j])} = {_where(images[i])} (same bytes)" for i, j in same],
                 [f"{_where(images[j])} ~ {_where(images[i])} (thumbnail cosine {cos:.3f})"
                  for i, j, cos in sorted(near)])
