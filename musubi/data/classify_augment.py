"""Classification augmentations on a stacked batch already on the device: random resized crop, flip, colour jitter.

Images are float [B, C, H, W] (C 3 or 1) on any device. Each sample draws its parameters from its own CPU
generator seeded by (seed, epoch, sample key) (the detection augment's `sample_seed`), so what a sample
becomes does not depend on the batch it lands in, the rank, the device or what ran before: a run resumed at
step k sees exactly the batches a run that never stopped saw. The draws are turned into a few small tensors
and the whole batch is transformed in one pass: the crop (with the flip folded in) is one `grid_sample`, the
colour jitter a handful of element-wise kernels, so the host never waits for the device.

The crop follows torchvision's RandomResizedCrop (area fraction in `crop_scale`, aspect ratio log-uniform in
`crop_ratio`, ten tries, else a centre crop of the clamped ratio), taken from the image as it reached the
device (already at the model's input size) and resized back to that size with bilinear sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from musubi.data.augment import LUMA, sample_seed

#: Tries of the crop's area and ratio before the centre crop (torchvision's RandomResizedCrop).
CROP_TRIES = 10
#: Uniforms drawn per sample: 4 per crop try (area, ratio, top, left), flip, brightness, contrast, saturation.
DRAWS = 4 * CROP_TRIES + 4


@dataclass(frozen=True)
class ClassDraw:
    """One sample's random parameters: crop window in pixels (top, left, height, width), flip, colour factors."""

    crop: tuple[int, int, int, int]
    flip: bool
    brightness: float
    contrast: float
    saturation: float


@dataclass(frozen=True)
class ClassifyAugment:
    """The augmentations of a classifier's `data.augment` (probabilities and ranges; 0 or None is off)."""

    crop_scale: tuple[float, float] | None = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (0.75, 4 / 3)
    hflip: float = 0.5
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0

    def active(self, channels: int = 3) -> list[str]:
        """Names of the augmentations that can change a sample, in the order they run."""
        colour = self.brightness > 0 or self.contrast > 0 or (self.saturation > 0 and channels > 1)
        on = [("crop", self.crop_scale is not None), ("hflip", self.hflip > 0), ("colour", colour)]
        return [name for name, used in on if used]

    def draw(self, seed: int, epoch: int, key: int, height: int, width: int) -> ClassDraw:
        """The parameters of sample `key` in `epoch` for an image of height x width pixels."""
        g = torch.Generator()
        g.manual_seed(sample_seed(seed, epoch, key))
        u = torch.rand(DRAWS, generator=g, dtype=torch.float64).tolist()  # all drawn: the stream never shifts
        crop = (0, 0, height, width)
        if self.crop_scale is not None:
            crop = crop_window(u[: 4 * CROP_TRIES], height, width, self.crop_scale, self.crop_ratio)
        b, c, s = u[4 * CROP_TRIES + 1:]
        return ClassDraw(crop=crop, flip=u[4 * CROP_TRIES] < self.hflip,
                         brightness=1.0 + self.brightness * (2 * b - 1), contrast=1.0 + self.contrast * (2 * c - 1),
                         saturation=1.0 + self.saturation * (2 * s - 1))

    def __call__(self, images: Tensor, keys: list[int], seed: int, epoch: int,
                 bounds: tuple[float, float] | None = (0.0, 1.0)) -> Tensor:
        """The augmented batch [B, C, H, W] (a new tensor); `keys`: one stable integer per sample (its index).

        `bounds`: the pixels' range, kept after colour jitter (None: unbounded values, e.g. zero-centred data).
        """
        _, _, h, w = images.shape
        draws = [self.draw(seed, epoch, k, h, w) for k in keys]
        out = images
        if any(d.crop != (0, 0, h, w) or d.flip for d in draws):
            out = crop_and_flip(out, [d.crop for d in draws], [d.flip for d in draws])
        factors = [(d.brightness, d.contrast, d.saturation) for d in draws]
        if any(f != (1.0, 1.0, 1.0) for f in factors):
            out = colour_batch(out, host_tensor(factors, out.device), bounds)
        return out


def crop_window(u: list[float], height: int, width: int, scale: tuple[float, float],
                ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params from given uniforms: (top, left, h, w) in pixels."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for t in range(CROP_TRIES):
        ua, ur, ut, ul = u[4 * t: 4 * t + 4]
        target = area * (scale[0] + (scale[1] - scale[0]) * ua)
        aspect = math.exp(log_lo + (log_hi - log_lo) * ur)
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return min(int(ut * (height - h + 1)), height - h), min(int(ul * (width - w + 1)), width - w), h, w
    # No try fitted: the centre crop of the whole image at the nearest allowed ratio.
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def host_tensor(rows: list[tuple[float, ...]], device: torch.device) -> Tensor:
    """Per-sample parameters [B, K] float32 on `device`, copied from pinned memory without making the host wait."""
    t = torch.tensor(rows, dtype=torch.float32)
    if device.type == "cuda":
        # The caching host allocator keeps the pinned block until the copy has run (it records the stream).
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def crop_and_flip(images: Tensor, crops: list[tuple[int, int, int, int]], flips: list[bool]) -> Tensor:
    """Each image's crop window (top, left, h, w) resized back to H x W, mirrored where flipped: one grid_sample.

    Output pixel x samples the input at left + (x + 0.5) * w / W - 0.5 (half-pixel centres, as a bilinear
    resize of the crop); border padding only matters at the crop's outer half pixel.
    """
    b, _, h, w = images.shape
    rows = []
    for (top, left, ch, cw), flip in zip(crops, flips, strict=True):
        sx, sy = cw / w, ch / h  # the crop's size as a fraction of the image
        tx, ty = (2 * left + cw) / w - 1, (2 * top + ch) / h - 1  # its centre in [-1, 1] coordinates
        rows.append((-sx if flip else sx, 0.0, tx, 0.0, sy, ty))
    theta = host_tensor(rows, images.device).view(b, 2, 3)
    src = images if images.dtype in (torch.float32, torch.float64) else images.float()
    grid = F.affine_grid(theta.to(src.dtype), [b, 1, h, w], align_corners=False)
    return F.grid_sample(src, grid, mode="bilinear", padding_mode="border", align_corners=False).to(images.dtype)


def colour_batch(images: Tensor, factors: Tensor, bounds: tuple[float, float] | None) -> Tensor:
    """Brightness (scale), contrast (about each image's mean grey), saturation (about each pixel's grey).

    `factors` [B, 3] holds each sample's (brightness, contrast, saturation); a 1-channel image is its own grey,
    so saturation leaves it alone. `bounds` clamps the result (None: no clamp).
    """
    b, c = factors[:, 0, None, None, None], factors[:, 1, None, None, None]  # each [B, 1, 1, 1]
    out = images * b.to(images.dtype)
    mean = grey(out).mean(dim=(-2, -1), keepdim=True)  # [B, 1, 1, 1]
    out = (out - mean) * c.to(images.dtype) + mean
    if images.shape[1] == 3:
        s = factors[:, 2, None, None, None].to(images.dtype)
        g = grey(out)
        out = (out - g) * s + g
    return out.clamp_(*bounds) if bounds is not None else out


def grey(images: Tensor) -> Tensor:
    """[B, 1, H, W] luma of [B, 3, H, W] images (ITU-R BT.601 weights as scalars); a 1-channel batch as it is."""
    if images.shape[1] == 1:
        return images
    r, g, b = LUMA
    return images[:, 0:1] * r + images[:, 1:2] * g + images[:, 2:3] * b
