"""Crafted readings: whole machines (GPUs, stack, topology) built in a line, for the real check functions."""

from __future__ import annotations

import dataclasses
from typing import Any

from musubi.preflight.readings import StackReading
from musubi.topology.nvml import GpuReading, NvmlReading

GiB = 2**30

H100 = {"name": "NVIDIA H100 80GB HBM3", "capability": (9, 0), "memory_total": int(79.6 * GiB)}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "capability": (8, 0), "memory_total": int(79.2 * GiB)}
RTX5090 = {"name": "NVIDIA GeForce RTX 5090", "capability": (12, 0), "memory_total": int(31.4 * GiB)}
V100 = {"name": "Tesla V100-SXM2-32GB", "capability": (7, 0), "memory_total": int(31.7 * GiB)}


def gpu(index: int, model: dict[str, Any] | None = None, **kw: Any) -> GpuReading:
    """An idle, healthy GPU of `model` (H100 by default), with any field overridden."""
    fields = {**(model or H100), "memory_used": 500 << 20, "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
              "uuid": f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000", "pcie_gen_max": 5, "pcie_width_max": 16}
    fields.update(kw)
    return GpuReading(index=index, **fields)


def nvml(*gpus: GpuReading, driver: str = "580.82.07", cuda: str = "13.0") -> NvmlReading:
    """NVML listing these GPUs with a driver."""
    return NvmlReading(True, gpus=tuple(gpus), driver_version=driver, driver_cuda_version=cuda)


NO_NVML = NvmlReading(False, error="NVML Shared Library Not Found")


def stack(**kw: Any) -> StackReading:
    """torch 2.14.1+cu130 on a working CUDA machine (sm_75..sm_120), overridable."""
    base = StackReading(
        torch_version="2.14.1+cu130", cuda_version="13.0",
        arch_list=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"), cuda_available=True,
        cuda_device_count=8, cuda_error=None, nccl_available=True, nccl_version="2.27.7", gloo_available=True,
        driver_version="580.82.07", driver_cuda_version="13.0",
    )
    return dataclasses.replace(base, **kw)


def only(results: list, check: str | None = None):
    """The single result (optionally: the single one of `check`)."""
    picked = [r for r in results if check is None or r.check == check]
    assert len(picked) == 1, [r.line() for r in results]
    return picked[0]
