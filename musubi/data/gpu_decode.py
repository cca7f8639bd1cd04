"""Image decoding on the rank's device: loader workers only read file bytes, the device decodes the batch.

A batch's JPEG files are decoded in one call by the decoder the rank chose at start
(musubi.data.jpeg_decoder: nvImageCodec on the GPU's hardware JPEG engines where
they can be used, else `torchvision.io.decode_jpeg(list, device="cuda")`, nvJPEG's
CUDA kernels on the SMs); resizing and box scaling then happen on the device too,
so a 4K frame never crosses PCIe as decoded pixels. What the engines refuse goes to
nvJPEG on the SMs; what nvJPEG cannot read (PNG, TIFF, 12/16-bit, CMYK JPEG) is
found from its header and decoded on the host, image by image, and counted
(`DecodeStats`): one odd file never stops a run. On a CPU rank the same code
decodes on the host (the tests run it there).
"""

from __future__ import annotations

import io
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from musubi.data.jpeg_decoder import JpegDecoder
from musubi.data.stage_clock import StageClock, timed

log = logging.getLogger(__name__)

#: Start-of-frame markers nvJPEG decodes: baseline, extended and progressive Huffman.
NVJPEG_SOF = frozenset({0xC0, 0xC1, 0xC2})
#: Every other start-of-frame marker (lossless, hierarchical, arithmetic coding).
OTHER_SOF = frozenset({0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def host_only_reason(data: Tensor) -> str | None:
    """Why these file bytes must be decoded on the host ("PNG", "CMYK JPEG", "12-bit JPEG", ...), or None (nvJPEG)."""
    buf = memoryview(data.numpy())
    n = len(buf)
    if n < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        head = bytes(buf[:12])
        if head.startswith(b"\x89PNG"):
            return "PNG"
        if head[:4] in (b"II*\x00", b"MM\x00*"):
            return "TIFF"
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            return "WebP"
        return "not JPEG"
    i = 2
    while i + 4 <= n:  # walk the marker segments to the frame header (usually within the first few KiB)
        if buf[i] != 0xFF:
            return "damaged JPEG header"
        marker = buf[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in NVJPEG_SOF or marker in OTHER_SOF:
            if i + 10 > n:
                return "damaged JPEG header"
            precision, components = buf[i + 4], buf[i + 9]
            if precision != 8:
                return f"{precision}-bit JPEG"
            if components == 4:
                return "CMYK JPEG"
            if components not in (1, 3):
                return f"{components}-channel JPEG"
            return None if marker in NVJPEG_SOF else "lossless/arithmetic JPEG"
        if marker == 0xDA:  # scan data before any frame header
            return "damaged JPEG header"
        i += 2 + ((buf[i + 2] << 8) | buf[i + 3])
    return "damaged JPEG header"


def decode_on_host(data: Tensor) -> Tensor:
    """uint8 [3, H, W] of any image PIL reads (16-bit scaled to 8, CMYK and grey converted to RGB)."""
    with Image.open(io.BytesIO(data.numpy().tobytes())) as im:
        if im.mode in ("I;16", "I;16B", "I;16L", "I"):
            # PIL's convert("RGB") clips 16-bit values at 255; scale them to 8 bits instead.
            arr = np.asarray(im, dtype=np.uint32) >> (8 if im.mode.startswith("I;16") else 24)
            arr = np.repeat(arr.astype(np.uint8)[..., None], 3, axis=2)
        else:
            arr = np.asarray(im.convert("RGB"))
    return torch.from_numpy(np.array(arr)).permute(2, 0, 1).contiguous()  # a writable copy (PIL's is read-only)


@dataclass
class DecodeStats:
    """Images decoded on the device (of them, on its hardware JPEG engines) and on the host (with why), and when
    to warn again."""

    device: int = 0
    host: Counter = field(default_factory=Counter)
    #: The JPEG decoder the rank chose at start (jpeg_decoder.JpegDecoder.name); "" until one is chosen.
    decoder: str = ""
    #: Of the device decodes, those the hardware engines made.
    hardware: int = 0
    _next_warning: int = 1

    def count_host(self, reason: str, name: str) -> None:
        """Count one host decode; warn at the 1st, 10th, 100th, ... (a counted warning, not one line per image)."""
        self.host[reason] += 1
        total = sum(self.host.values())
        if total >= self._next_warning:
            self._next_warning *= 10
            log.warning("%d image(s) decoded on the host, not by nvJPEG (%s; latest: %s): they cost host time "
                        "in the training process; convert them to 8-bit RGB JPEG for the fast path", total,
                        ", ".join(f"{k}: {v}" for k, v in self.host.most_common()), name)

    def record(self) -> dict[str, object]:
        """summary.json's view: counts per place and the reasons for host decodes."""
        return {"decoder": self.decoder, "device": self.device, "hardware": self.hardware,
                "host": sum(self.host.values()), "host_reasons": dict(self.host)}


class PackedBytes(NamedTuple):
    """A batch's file bytes in one uint8 tensor: one shared-memory handle from a loader worker and one pinned
    copy a batch, not one of each per image (each costs the main process a socket round trip and an mmap)."""

    data: Tensor  # uint8 [sum of sizes]
    sizes: list[int]

    def unpack(self) -> list[Tensor]:
        """The files' bytes, one contiguous view of `data` each."""
        return list(self.data.split(self.sizes))


def pack_bytes(encoded: list[Tensor]) -> PackedBytes:
    """File bytes per image (uint8 [N]) -> PackedBytes (in the loader worker, by the task's collate)."""
    return PackedBytes(torch.cat(encoded) if encoded else torch.empty(0, dtype=torch.uint8),
                       [int(e.numel()) for e in encoded])


def decode_images(encoded: list[Tensor], device: torch.device, stats: DecodeStats | None = None,
                  decoder: JpegDecoder | None = None) -> list[Tensor]:
    """File bytes (uint8 [N] on the host) per image -> uint8 [3, H, W] on `device`: the hardware JPEG engines
    where `decoder` holds them, else nvJPEG, else the host."""
    from torchvision.io import ImageReadMode, decode_jpeg

    stats = stats if stats is not None else DecodeStats()
    out: list[Tensor | None] = [None] * len(encoded)
    reasons = [host_only_reason(data) for data in encoded]
    fast = [i for i, r in enumerate(reasons) if r is None]
    hardware = decoder.hardware if decoder is not None and device.type == "cuda" else None
    if fast and hardware is not None:
        try:
            engines = hardware.decode([encoded[i] for i in fast])
        except RuntimeError:  # the batch refused as a whole: each image tries nvJPEG below
            engines = [None] * len(fast)
        for i, img in zip(fast, engines, strict=True):
            out[i] = img
        stats.hardware += sum(img is not None for img in engines)
        fast = [i for i in fast if out[i] is None]
    if fast:
        try:  # one batched call: nvJPEG on CUDA, libjpeg-turbo on a CPU rank
            for i, img in zip(fast, decode_jpeg([encoded[i] for i in fast], mode=ImageReadMode.RGB, device=device),
                              strict=True):
                out[i] = img
        except RuntimeError as e:  # a file the header check passed but nvJPEG refused: find it alone
            first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
            for i in fast:
                try:
                    out[i] = decode_jpeg(encoded[i], mode=ImageReadMode.RGB, device=device)
                except RuntimeError:
                    reasons[i] = f"nvJPEG refused it ({first_line[:80]})"
    for i, reason in enumerate(reasons):
        if out[i] is None:
            stats.count_host(reason or "nvJPEG refused it", f"image {i} of the batch")
            out[i] = decode_on_host(encoded[i]).to(device, non_blocking=True)
        else:
            stats.device += 1
    return [img for img in out if img is not None]


def fit_side(images: list[Tensor], boxes: list[Tensor], side: int) -> tuple[list[Tensor], list[Tensor]]:
    """Float images resized so the longer side is `side` (per-axis box scale from the realised size).

    Boxes may live on the host while the images are on the device (decode_batch keeps them there).
    """
    out_images, out_boxes = [], []
    for img, b in zip(images, boxes, strict=True):
        _, h, w = img.shape
        scale = side / max(w, h)
        nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
        if (nw, nh) != (w, h):
            img = F.interpolate(img[None], size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)[0]
            img = img.clamp_(0.0, 1.0)  # antialiased bilinear overshoots a little at edges
            b = b * torch.tensor([nw / w, nh / h, nw / w, nh / h], device=b.device, dtype=b.dtype)
        out_images.append(img)
        out_boxes.append(b)
    return out_images, out_boxes


def unit_float(images: list[Tensor]) -> list[Tensor]:
    """uint8 [3, H, W] images -> float in [0, 1]; a batch of one size converts in one kernel, not one per image."""
    if len(images) > 1 and len({tuple(i.shape) for i in images}) == 1:
        return list(torch.stack(images).float().div_(255.0).unbind(0))  # views of one [N, 3, H, W] tensor
    return [img.float().div_(255.0) for img in images]


def clip_boxes(boxes: Tensor, labels: Tensor, w: int, h: int) -> tuple[Tensor, Tensor]:
    """Boxes [N, 4] xyxy clipped to a w x h image; the ones that vanish are dropped with their labels."""
    limit = torch.tensor([w, h, w, h], device=boxes.device, dtype=boxes.dtype)
    boxes = torch.minimum(boxes.clamp(min=0), limit)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    return boxes[keep], labels[keep]


def targets_to(targets: list[dict[str, Tensor]], device: torch.device) -> list[dict[str, Tensor]]:
    """Targets to `device` in one copy per key (not one per image): a batch's boxes cross PCIe together."""
    if not targets:
        return []
    out: list[dict[str, Tensor]] = [{} for _ in targets]
    pin = device.type == "cuda"  # a copy from pageable memory would make the host wait for it
    for key in targets[0]:
        parts = [t[key] for t in targets]
        if all(p.dim() >= 1 for p in parts):
            sizes = [p.shape[0] for p in parts]
            joined = torch.cat(parts)
            moved = (joined.pin_memory() if pin else joined).to(device, non_blocking=True).split(sizes)
        else:  # scalars (image_id)
            joined = torch.stack(parts)
            moved = (joined.pin_memory() if pin else joined).to(device, non_blocking=True).unbind(0)
        for t, m in zip(out, moved, strict=True):
            t[key] = m
    return out


def decode_batch(encoded: list[Tensor], targets: list[dict[str, Tensor]], device: torch.device,
                 image_size: int | None, stats: DecodeStats | None = None, clock: StageClock | None = None,
                 move_targets: bool = True, decoder: JpegDecoder | None = None,
                 ) -> tuple[list[Tensor], list[dict[str, Tensor]]]:
    """File bytes per image -> float [3, H, W] in [0, 1] on `device`, resized to `image_size`, boxes scaled/clipped.

    Box arithmetic stays on the host, where the targets already are: on a CUDA stream a small
    `torch.tensor(..., device=)` and a boolean index each make the host wait for the stream (three an image,
    48 a batch of 16, each holding up the prefetch thread). The targets then cross in one copy per key (`move_targets`;
    False leaves them on the host for augmenting first). `clock` times decode, convert and h2d. `decoder`: the
    rank's JPEG decoder (musubi.data.jpeg_decoder.choose); None decodes with nvJPEG (CUDA) or on the host.
    """
    with timed(clock, "decode", device):
        decoded = decode_images(list(encoded), device, stats, decoder)
    with timed(clock, "convert", device):
        images = unit_float(decoded)
        boxes = [t["boxes"] for t in targets]
        if image_size is not None:
            images, boxes = fit_side(images, boxes, image_size)
        out = []
        for img, t, b in zip(images, targets, boxes, strict=True):
            t = dict(t)
            t["boxes"], t["labels"] = clip_boxes(b, t["labels"], img.shape[2], img.shape[1])
            out.append(t)
    if not move_targets:
        return images, out
    with timed(clock, "h2d", device):
        return images, targets_to(out, device)

