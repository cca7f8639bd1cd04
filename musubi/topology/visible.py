"""How many GPUs this process may use, counted without importing torch when the answer is plain.

torch takes seconds to import on a small machine; the launcher needs the count to size the world and to
refuse `--nproc 64` before anything else. No NVIDIA driver: 0. NVML and a CUDA_VISIBLE_DEVICES of plain
indices (or none): NVML's count with CUDA's rule applied (the list stops at the first invalid entry).
Anything else (UUIDs, MIG): torch's own count, which asks NVML without starting the CUDA driver.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where the NVIDIA kernel driver shows itself; without it no process here can use a GPU.
DRIVER_MARKS = (Path("/proc/driver/nvidia"), Path("/dev/nvidiactl"))


def driver_present() -> bool:
    """Whether the NVIDIA kernel driver is loaded on this machine."""
    return any(p.exists() for p in DRIVER_MARKS)


def nvml_count() -> int | None:
    """GPUs NVML sees on the machine (CUDA_VISIBLE_DEVICES not applied), or None when NVML cannot answer."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no library, no driver, a container without NVML: torch decides
        return None


def apply_visible(count: int, visible: str | None) -> int | None:
    """GPUs left after CUDA_VISIBLE_DEVICES: its valid leading indices (CUDA stops at the first invalid one);
    None when the list names GPUs otherwise (UUIDs, MIG instances). A repeated index leaves none, as in torch."""
    if visible is None:
        return count
    seen: list[int] = []
    for part in visible.split(","):
        part = part.strip()
        if not part.lstrip("-").isdigit():
            return None if part else len(seen)
        index = int(part)
        if index in seen:
            return 0  # CUDA (and torch) refuse a list that repeats a GPU: none is visible
        if index < 0 or index >= count:
            break
        seen.append(index)
    return len(seen)


def visible_gpus() -> int:
    """GPUs this process may use (CUDA_VISIBLE_DEVICES applied); imports torch only when the plain answers fail."""
    if not driver_present():
        return 0
    count = nvml_count()
    if count is not None:
        n = apply_visible(count, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if n is not None:
            return n
    import torch

    # torch counts with NVML when it can (PYTORCH_NVML_BASED_CUDA_CHECK), else the runtime; never is_available().
    return torch.cuda.device_count()
