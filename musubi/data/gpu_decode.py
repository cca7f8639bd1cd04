"""JPEG decoding on the GPU: loader workers only read file bytes, the rank's device decodes (nvJPEG).

`torchvision.io.decode_jpeg(list, device="cuda")` decodes a whole batch in one
call; resizing and box scaling then happen on the device too, so a 4K frame
never crosses PCIe as decoded pixels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def decode_batch(encoded: list[Tensor], targets: list[dict[str, Tensor]], device: torch.device,
                 image_size: int | None) -> tuple[list[Tensor], list[dict[str, Tensor]]]:
    """Encoded JPEG bytes (uint8 [N]) per image -> float [3, H, W] in [0, 1] on `device`, boxes scaled/clipped."""
    from torchvision.io import ImageReadMode, decode_jpeg

    # nvJPEG reads host tensors and writes to the device; on a CPU rank this decodes on the host.
    decoded = decode_jpeg(list(encoded), mode=ImageReadMode.RGB, device=device)
    images: list[Tensor] = []
    out_targets: list[dict[str, Tensor]] = []
    for img, target in zip(decoded, targets, strict=True):
        img = img.to(device)
        t = {k: v.to(device, non_blocking=True) for k, v in target.items()}
        _, h, w = img.shape
        x = img.unsqueeze(0).float().div_(255.0)
        boxes = t["boxes"]
        if image_size is not None:
            scale = image_size / max(w, h)
            nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
            x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)
            boxes = boxes * torch.tensor([nw / w, nh / h, nw / w, nh / h], device=device)
            w, h = nw, nh
        boxes = torch.stack([boxes[:, 0].clamp(0, w), boxes[:, 1].clamp(0, h),
                             boxes[:, 2].clamp(0, w), boxes[:, 3].clamp(0, h)], 1)
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        t["boxes"], t["labels"] = boxes[keep], t["labels"][keep]
        images.append(x[0].clamp_(0.0, 1.0))
        out_targets.append(t)
    return images, out_targets
