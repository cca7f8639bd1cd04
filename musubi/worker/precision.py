"""Per-job mixed precision: autocast dtype and the fp16 gradient scaler."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def resolve_precision(requested: str, device: torch.device) -> str:
    """`auto` -> bf16 on GPU (fp16 on a GPU without bf16: V100, T4), fp32 on CPU ranks (CPU autocast is slow
    and rarely wanted). Where a loss goes non-finite, the numerical guard steps it down (recovery/numerics.py)."""
    if requested == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return requested


@contextlib.contextmanager
def autocast(precision: str, device: torch.device) -> Iterator[None]:
    """Autocast region for the forward pass; fp32 is a plain region."""
    if precision == "fp32":
        yield
        return
    with torch.autocast(device_type=device.type, dtype=_DTYPES[precision]):
        yield


def make_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A gradient scaler, enabled only for fp16 (bf16 has fp32's exponent range)."""
    return torch.amp.GradScaler(device.type, enabled=(precision == "fp16"))
