"""Detection augmentations on a batch already on the device: mosaic, scale jitter, horizontal flip, colour jitter.

Images are float [3, H, W] in [0, 1] on any device (the GPU in training, the
CPU in tests), or [1, H, W] single-channel frames in their stored units (counts,
centikelvin) with the range of their type as `bounds`; boxes [N, 4] xyxy in
image pixels follow every geometric change.
Each sample draws its parameters from its own CPU generator seeded by (seed,
epoch, sample key), so the stream does not depend on the batch it lands in, on
the device, or on what ran before: a run resumed at step k sees exactly the
batches a run that never stopped saw. The order is mosaic, scale, flip, colour.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from musubi.data.gpu_decode import clip_boxes

#: Boxes thinner than this (pixels) after a resize are dropped with their labels: nothing left to detect.
MIN_BOX_SIDE = 1.0
#: Luma weights (ITU-R BT.601) of the grey image behind contrast and saturation.
LUMA = (0.299, 0.587, 0.114)

Target = dict[str, Tensor]
#: A pixel range kept after a change (low, high), or None for unbounded values (float frames).
Bounds = tuple[float, float] | None
#: The range of RGB images in [0, 1].
UNIT = (0.0, 1.0)


def sample_seed(seed: int, epoch: int, key: int) -> int:
    """A 63-bit seed for one sample of one epoch (splitmix64 of the three, so near keys do not correlate)."""
    x = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + key * 0x94D049BB133111EB) & (2**64 - 1)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = ((x ^ (x >> shift)) * mult) & (2**64 - 1)
    return (x ^ (x >> 31)) & (2**63 - 1)


@dataclass(frozen=True)
class Draw:
    """One sample's random parameters (all drawn whether used or not: the stream never shifts)."""

    mosaic: bool
    centre: tuple[float, float]  # of the mosaic, as fractions of width and height in [0.25, 0.75]
    scale: float
    flip: bool
    brightness: float
    contrast: float
    saturation: float


@dataclass(frozen=True)
class Augment:
    """The augmentations of `data.augment` (probabilities and ranges; 0 or None is off)."""

    hflip: float = 0.0
    scale: tuple[float, float] | None = None
    mosaic: float = 0.0
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0

    def active(self) -> list[str]:
        """Names of the augmentations that can change a sample, in the order they run."""
        on = [("mosaic", self.mosaic > 0), ("scale", self.scale is not None and self.scale != (1.0, 1.0)),
              ("hflip", self.hflip > 0),
              ("colour", self.brightness > 0 or self.contrast > 0 or self.saturation > 0)]
        return [name for name, used in on if used]

    def draw(self, seed: int, epoch: int, key: int) -> Draw:
        """The parameters of sample `key` in `epoch`."""
        g = torch.Generator()
        g.manual_seed(sample_seed(seed, epoch, key))
        u = torch.rand(8, generator=g, dtype=torch.float64).tolist()
        lo, hi = self.scale or (1.0, 1.0)
        return Draw(mosaic=u[0] < self.mosaic, centre=(0.25 + 0.5 * u[1], 0.25 + 0.5 * u[2]),
                    scale=lo + (hi - lo) * u[3], flip=u[4] < self.hflip,
                    brightness=1.0 + self.brightness * (2 * u[5] - 1), contrast=1.0 + self.contrast * (2 * u[6] - 1),
                    saturation=1.0 + self.saturation * (2 * u[7] - 1))

    def __call__(self, images: list[Tensor], targets: list[Target], keys: list[int], seed: int,
                 epoch: int, bounds: Bounds = UNIT) -> tuple[list[Tensor], list[Target]]:
        """The augmented batch (new lists; `keys`: one stable integer per sample, e.g. its image_id).

        `bounds`: the pixels' range, kept after every change (None: unbounded, e.g. float thermal frames).
        """
        draws = [self.draw(seed, epoch, k) for k in keys]
        out_images, out_targets = [], []
        n = len(images)
        for i, d in enumerate(draws):
            img, t = images[i], dict(targets[i])
            boxes, labels = t["boxes"], t["labels"]
            if d.mosaic:
                picks = [(i + j) % n for j in range(4)]
                img, boxes, labels = mosaic([images[p] for p in picks], [targets[p]["boxes"] for p in picks],
                                            [targets[p]["labels"] for p in picks], d.centre, bounds)
            if d.scale != 1.0:
                img, boxes, labels = rescale(img, boxes, labels, d.scale, bounds)
            if d.flip:
                img, boxes = hflip(img, boxes)
            if (d.brightness, d.contrast, d.saturation) != (1.0, 1.0, 1.0):
                img = colour(img, d.brightness, d.contrast, d.saturation, bounds)
            t["boxes"], t["labels"] = boxes, labels
            out_images.append(img)
            out_targets.append(t)
        return out_images, out_targets


def hflip(img: Tensor, boxes: Tensor) -> tuple[Tensor, Tensor]:
    """Mirror left-right: x -> W - x (x1 and x2 swap roles)."""
    w = img.shape[-1]
    return img.flip(-1), torch.stack([w - boxes[:, 2], boxes[:, 1], w - boxes[:, 0], boxes[:, 3]], 1)


def resize(img: Tensor, boxes: Tensor, labels: Tensor | None, h: int, w: int, bounds: Bounds = UNIT
           ) -> tuple[Tensor, Tensor, Tensor | None]:
    """Image resized to h x w (bilinear, antialiased), boxes scaled per axis; boxes under MIN_BOX_SIDE dropped."""
    _, h0, w0 = img.shape
    if (h, w) != (h0, w0):
        img = F.interpolate(img[None], size=(h, w), mode="bilinear", align_corners=False, antialias=True)[0]
        img = clamp(img, bounds)
        boxes = boxes * torch.tensor([w / w0, h / h0, w / w0, h / h0], device=boxes.device, dtype=boxes.dtype)
    keep = ((boxes[:, 2] - boxes[:, 0]) >= MIN_BOX_SIDE) & ((boxes[:, 3] - boxes[:, 1]) >= MIN_BOX_SIDE)
    return img, boxes[keep], None if labels is None else labels[keep]


def rescale(img: Tensor, boxes: Tensor, labels: Tensor, factor: float, bounds: Bounds = UNIT
            ) -> tuple[Tensor, Tensor, Tensor]:
    """Scale jitter: the image and its boxes by `factor` (sizes rounded, at least 1 pixel), labels kept alike."""
    _, h, w = img.shape
    out, b, kept = resize(img, boxes, labels, max(1, round(h * factor)), max(1, round(w * factor)), bounds)
    assert kept is not None
    return out, b, kept


def mosaic(images: list[Tensor], boxes: list[Tensor], labels: list[Tensor], centre: tuple[float, float],
           bounds: Bounds = UNIT) -> tuple[Tensor, Tensor, Tensor]:
    """Four images in the quadrants around `centre` (fractions) of the first one's canvas, each resized to fit.

    Quadrant k (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right) holds images[k]; its boxes are
    scaled into the quadrant and shifted to its corner, so they stay inside it.
    """
    c, h, w = images[0].shape
    if h < 2 or w < 2:
        return images[0], boxes[0], labels[0]
    cx = min(w - 1, max(1, round(centre[0] * w)))
    cy = min(h - 1, max(1, round(centre[1] * h)))
    canvas = images[0].new_zeros((c, h, w))
    out_boxes, out_labels = [], []
    for k, (x0, y0, x1, y1) in enumerate(quadrants(w, h, cx, cy)):
        img, b, lab = resize(images[k], boxes[k], labels[k], y1 - y0, x1 - x0, bounds)
        canvas[:, y0:y1, x0:x1] = img
        out_boxes.append(b + torch.tensor([x0, y0, x0, y0], device=b.device, dtype=b.dtype))
        assert lab is not None
        out_labels.append(lab)
    return canvas, torch.cat(out_boxes), torch.cat(out_labels)


def quadrants(w: int, h: int, cx: int, cy: int) -> list[tuple[int, int, int, int]]:
    """The four quadrant windows (x0, y0, x1, y1) around (cx, cy): top-left, top-right, bottom-left, bottom-right."""
    return [(0, 0, cx, cy), (cx, 0, w, cy), (0, cy, cx, h), (cx, cy, w, h)]


def colour(img: Tensor, brightness: float, contrast: float, saturation: float, bounds: Bounds = UNIT) -> Tensor:
    """Brightness (scale), contrast (about the mean grey) and saturation (about each pixel's grey), clamped.

    A 1-channel image is its own grey: saturation leaves it unchanged.
    """
    out = img * brightness
    if contrast != 1.0:
        mean = grey_of(out).mean()
        out = (out - mean) * contrast + mean
    if saturation != 1.0:
        grey = grey_of(out)[None]
        out = (out - grey) * saturation + grey
    return clamp(out, bounds)


def clamp(img: Tensor, bounds: Bounds) -> Tensor:
    """`img` clamped in place to `bounds` (None: unchanged)."""
    return img if bounds is None else img.clamp_(*bounds)


def grey_of(img: Tensor) -> Tensor:
    """[H, W] luma of a [3, H, W] image, weighted by scalars (a weight tensor on a CUDA stream would wait for it);
    a [1, H, W] image's only channel."""
    if img.shape[0] == 1:
        return img[0]
    r, g, b = LUMA
    return img[0] * r + img[1] * g + img[2] * b


def keep_inside(img: Tensor, target: Target) -> Target:
    """The target with its boxes clipped to the image (and vanished ones dropped): a last guard after augmenting."""
    t = dict(target)
    t["boxes"], t["labels"] = clip_boxes(t["boxes"], t["labels"], img.shape[2], img.shape[1])
    return t
