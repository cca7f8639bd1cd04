"""Slicing large images into overlapping tiles (SAHI-style), for training and for sliced inference.

A frame of W x H is covered by a grid of `tile` x `tile` windows whose stride is
tile * (1 - overlap); the last row and column are moved back to end exactly at
the border, so every tile is full size (a frame smaller than a tile in a side is one tile there,
padded with zeros right and below to the full tile by its readers and writers, as SAHI pads).
A box is clipped to each tile it touches and kept when at least `min_visibility`
of its area remains: a box fully inside a tile is kept there unchanged (its tile
coordinates plus the tile origin give the original back exactly).
Sliced inference runs the model on the tiles of a full image, shifts the
detections back to frame coordinates and merges them with class-wise NMS.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from musubi.contract.errors import ConfigError

Window = tuple[int, int, int, int]  # x0, y0, x1, y1 in frame pixels

#: Detections a merged frame keeps (sliced_predict), and the best boxes that take part in a merge (greedy_merge):
#: part of the merge rule a deployment reproduces (the export records both).
MAX_MERGED_DETECTIONS = 300
MERGE_LIMIT = 3000


@dataclass(frozen=True)
class SliceParams:
    """How frames are cut: tile side (px), overlap fraction, kept box fraction, empty tiles kept."""

    tile: int = 640
    overlap: float = 0.2
    min_visibility: float = 0.5
    empty_ratio: float = 0.1
    seed: int = 0

    def check(self) -> None:
        """ConfigError naming the bad parameter."""
        if self.tile < 16:
            raise ConfigError(f"slice tile {self.tile}: must be >= 16 px")
        if not 0.0 <= self.overlap < 1.0:
            raise ConfigError(f"slice overlap {self.overlap}: must be in [0, 1)")
        if not 0.0 < self.min_visibility <= 1.0:
            raise ConfigError(f"slice min_visibility {self.min_visibility}: must be in (0, 1]")
        if not 0.0 <= self.empty_ratio <= 1.0:
            raise ConfigError(f"slice empty_ratio {self.empty_ratio}: must be in [0, 1]")


def _starts(length: int, tile: int, stride: int) -> list[int]:
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile, stride))
    starts.append(length - tile)  # the last tile ends at the border, full size
    return starts


def tile_grid(width: int, height: int, tile: int, overlap: float) -> list[Window]:
    """Windows covering a width x height frame, row by row."""
    stride = max(1, int(tile * (1.0 - overlap)))
    return [(x, y, min(x + tile, width), min(y + tile, height))
            for y in _starts(height, tile, stride) for x in _starts(width, tile, stride)]


def clip_boxes(boxes: np.ndarray, window: Window, min_visibility: float) -> tuple[np.ndarray, np.ndarray]:
    """Boxes [N, 4] xyxy in frame pixels -> (kept indices, their boxes in tile pixels)."""
    x0, y0, x1, y1 = window
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    clipped = np.stack([np.clip(boxes[:, 0], x0, x1), np.clip(boxes[:, 1], y0, y1),
                        np.clip(boxes[:, 2], x0, x1), np.clip(boxes[:, 3], y0, y1)], axis=1)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    inter = np.clip(clipped[:, 2] - clipped[:, 0], 0, None) * np.clip(clipped[:, 3] - clipped[:, 1], 0, None)
    keep = np.nonzero((area > 0) & (inter > 0) & (inter >= min_visibility * area))[0]
    return keep, clipped[keep] - np.array([x0, y0, x0, y0], dtype=np.float64)


def _keep_empty(seed: int, image_index: int, tile_index: int, ratio: float) -> bool:
    """Deterministic Bernoulli(ratio) per (seed, image, tile): the same tiles on every rank and run."""
    if ratio >= 1.0:
        return True
    if ratio <= 0.0:
        return False
    rng = np.random.default_rng([seed, image_index, tile_index])
    return bool(rng.random() < ratio)


@dataclass(frozen=True)
class TileRef:
    """One training sample: a window of a frame and its boxes (tile pixels) and labels."""

    image: int  # index of the frame in its dataset
    window: Window
    boxes: np.ndarray  # [K, 4] float64 xyxy in tile pixels
    labels: np.ndarray  # [K] int64


def plan_tiles(sizes: Sequence[tuple[int, int]], boxes: Sequence[np.ndarray], labels: Sequence[np.ndarray],
               p: SliceParams) -> tuple[list[TileRef], list[int]]:
    """Tiles of every frame (empty ones sampled at p.empty_ratio) and the tile count per frame."""
    p.check()
    tiles: list[TileRef] = []
    per_image: list[int] = []
    for i, ((w, h), b, lab) in enumerate(zip(sizes, boxes, labels, strict=True)):
        n = 0
        for t, window in enumerate(tile_grid(w, h, p.tile, p.overlap)):
            keep, tb = clip_boxes(b, window, p.min_visibility)
            if len(keep) == 0 and not _keep_empty(p.seed, i, t, p.empty_ratio):
                continue
            tiles.append(TileRef(i, window, tb, np.asarray(lab, dtype=np.int64)[keep]))
            n += 1
        per_image.append(n)
    return tiles, per_image


def greedy_merge(boxes: Tensor, scores: Tensor, labels: Tensor, threshold: float, metric: str = "ios",
                 limit: int = MERGE_LIMIT) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy non-maximum merging per class (SAHI's NMM): the best box absorbs every same-class box that
    overlaps it by `threshold` (`ios`: intersection over the smaller box; `iou`) and grows to their union.

    A tile that sees only part of an object gives a truncated box lying inside the full box another tile
    gives (IOS 1): merged, it neither stays as a duplicate nor, at equal scores, replaces the full box.
    Only the `limit` best boxes take part (the rest are below them in score). Returns sorted by score.
    """
    order = scores.argsort(descending=True)[:limit]
    b, s, lab = boxes[order].float(), scores[order], labels[order]
    n = len(b)
    if n == 0:
        return b, s, lab
    x1 = torch.maximum(b[:, None, 0], b[None, :, 0])
    y1 = torch.maximum(b[:, None, 1], b[None, :, 1])
    x2 = torch.minimum(b[:, None, 2], b[None, :, 2])
    y2 = torch.minimum(b[:, None, 3], b[None, :, 3])
    inter = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    area = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    if metric == "ios":
        denom = torch.minimum(area[:, None], area[None, :])
    elif metric == "iou":
        denom = area[:, None] + area[None, :] - inter
    else:
        raise ValueError(f"match metric {metric!r}: give ios or iou")
    match = (inter / denom.clamp(min=1e-9) >= threshold) & (lab[:, None] == lab[None, :])
    taken = torch.zeros(n, dtype=torch.bool, device=b.device)
    keep: list[int] = []
    out = b.clone()
    later = torch.arange(n, device=b.device)
    for i in range(n):
        if taken[i]:
            continue
        keep.append(i)
        group = match[i] & ~taken & (later > i)
        if group.any():
            members = torch.cat([b[i : i + 1], b[group]])
            out[i] = torch.cat([members[:, :2].min(0).values, members[:, 2:].max(0).values])
            taken |= group
    idx = torch.tensor(keep, dtype=torch.long, device=b.device)
    return out[idx].to(boxes.dtype), s[idx], lab[idx]


def sliced_predict(predict: Callable[[list[Tensor]], list[dict[str, Tensor]]], image: Tensor, tile: int,
                   overlap: float, batch: int = 8, iou: float = 0.5, max_detections: int = MAX_MERGED_DETECTIONS,
                   merge: str = "nmm", match_metric: str = "ios") -> dict[str, Tensor]:
    """Detections of one full image [3, H, W] from its tiles, in frame pixels, merged per class.

    `merge`: "nmm" (greedy_merge: overlapping boxes become their union) or "nms" (torchvision's
    batched_nms: the lower-scored box is dropped); `match_metric` (nmm only): ios or iou; `iou` is
    the overlap threshold of either.
    """
    from torchvision.ops import batched_nms

    _, h, w = image.shape
    windows = tile_grid(w, h, tile, overlap)
    boxes, scores, labels = [], [], []
    for start in range(0, len(windows), batch):
        chunk = windows[start : start + batch]
        outs = predict([image[:, y0:y1, x0:x1] for x0, y0, x1, y1 in chunk])
        for (x0, y0, _, _), out in zip(chunk, outs, strict=True):
            shift = torch.tensor([x0, y0, x0, y0], dtype=out["boxes"].dtype, device=out["boxes"].device)
            boxes.append(out["boxes"] + shift)
            scores.append(out["scores"])
            labels.append(out["labels"])
    if not boxes:
        empty = torch.zeros(0, device=image.device)
        return {"boxes": empty.reshape(0, 4), "scores": empty, "labels": empty.long()}
    b, s, lab = torch.cat(boxes), torch.cat(scores), torch.cat(labels)
    if merge == "nmm":
        mb, ms, ml = greedy_merge(b, s, lab, iou, match_metric)
        return {"boxes": mb[:max_detections], "scores": ms[:max_detections], "labels": ml[:max_detections]}
    if merge != "nms":
        raise ValueError(f"merge {merge!r}: give nmm or nms")
    keep = batched_nms(b.float(), s.float(), lab, iou)[:max_detections]  # sorted by score
    return {"boxes": b[keep], "scores": s[keep], "labels": lab[keep]}
