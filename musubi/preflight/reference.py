"""Reference numbers the checks compare readings with: drivers, architectures, GPUs, links, Xids.

Sources: NVIDIA CUDA toolkit release notes (driver table, minor-version
compatibility), the CUDA arch support of each toolkit, vendor datasheets
(dense BF16/FP16 tensor TFLOPS, memory, NVLink per-link speed).
"""

from __future__ import annotations

import re

Version = tuple[int, ...]


def parse_version(text: str) -> Version:
    """'570.124.06' -> (570, 124, 6); non-numeric parts are dropped."""
    return tuple(int(p) for p in re.findall(r"\d+", text))


def version_str(v: Version) -> str:
    """(570, 26) -> '570.26'."""
    return ".".join(str(p) for p in v)


#: Linux driver each CUDA toolkit (major, minor) was released with: full support, PTX JIT included.
TOOLKIT_DRIVER: dict[tuple[int, int], Version] = {
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13),
    (12, 1): (530, 30, 2),
    (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14),
    (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3),
    (12, 8): (570, 26),
    (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
}

#: Oldest driver that runs any toolkit of a CUDA major through minor-version compatibility
#: (works, but PTX newer than the driver cannot be JIT-compiled).
MAJOR_FLOOR_DRIVER: dict[int, Version] = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}


def toolkit_driver(cuda: tuple[int, int]) -> Version | None:
    """Driver a toolkit needs for full support (newest known minor at or below it)."""
    known = [k for k in TOOLKIT_DRIVER if k[0] == cuda[0] and k[1] <= cuda[1]]
    return TOOLKIT_DRIVER[max(known)] if known else None


#: First CUDA toolkit that can build kernels for an architecture (major, minor).
ARCH_MIN_CUDA: dict[tuple[int, int], str] = {
    (7, 0): "9.0", (7, 5): "10.0", (8, 0): "11.0", (8, 6): "11.1", (8, 7): "11.4", (8, 9): "11.8",
    (9, 0): "11.8", (10, 0): "12.8", (10, 3): "12.9", (11, 0): "13.0", (12, 0): "12.8", (12, 1): "12.9",
}

#: Last CUDA major that still builds an architecture family (CUDA 13 dropped Maxwell/Pascal/Volta).
ARCH_LAST_CUDA_MAJOR: dict[int, int] = {5: 12, 6: 12, 7: 12}


def arch_name(cap: tuple[int, int]) -> str:
    """(12, 0) -> 'sm_120'."""
    return f"sm_{cap[0]}{cap[1]}"


def min_cuda_for(cap: tuple[int, int]) -> str | None:
    """First CUDA version with kernels for this capability (same-major fallback), if known."""
    if cap in ARCH_MIN_CUDA:
        return ARCH_MIN_CUDA[cap]
    same = [k for k in ARCH_MIN_CUDA if k[0] == cap[0] and k[1] <= cap[1]]
    return ARCH_MIN_CUDA[max(same)] if same else None


#: (name pattern, dense BF16/FP16 tensor TFLOPS, memory GB; 0: varies). First match wins: specific first.
GPU_CATALOG: tuple[tuple[str, float, float], ...] = (
    ("GB200", 2500, 0), ("B200", 2250, 180), ("B100", 1750, 180),
    ("GH200", 989, 0), ("H200", 989, 141), ("H100 NVL", 835, 94), ("H100 PCIe", 756, 80),
    ("H100", 989, 80), ("H800", 989, 80), ("H20", 148, 96),
    ("A100", 312, 80), ("A800", 312, 80), ("A10G", 70, 24), ("A10", 125, 24), ("A30", 165, 24),
    ("A40", 150, 48), ("L40S", 362, 48), ("L40", 181, 48), ("L4", 121, 24),
    ("RTX PRO 6000", 500, 96), ("RTX 6000 Ada", 364, 48), ("RTX A6000", 155, 48),
    ("RTX 5090", 209, 32), ("RTX 4090", 165, 24), ("RTX 3090", 71, 24),
    ("V100", 125, 16), ("T4", 65, 16),
)


def gpu_spec(name: str) -> tuple[str, float, float] | None:
    """(catalog key, TFLOPS, memory GB) of a GPU name, e.g. 'NVIDIA H100 80GB HBM3'."""
    for key, tflops, mem in GPU_CATALOG:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name):
            return key, tflops, mem
    return None


def expected_memory_gb(name: str) -> float | None:
    """Memory a GPU of this name has: '40GB' in the name wins (A100-SXM4-40GB), else the catalog."""
    spec = gpu_spec(name)
    if spec is not None and spec[2] == 0:
        return None  # superchips name CPU+GPU memory together (GH200 480GB): no GPU-only figure
    m = re.search(r"(\d+)\s*GB", name)
    if m:
        return float(m.group(1))
    return spec[2] if spec else None


#: NVLink speed per link and direction, GB/s, by compute-capability major.
NVLINK_GBPS_PER_LINK: dict[int, float] = {6: 20.0, 7: 25.0, 8: 25.0, 9: 25.0, 10: 50.0}
#: PCIe speed per lane and direction, GB/s, by generation (after encoding overhead).
PCIE_GBPS_PER_LANE: dict[int, float] = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
#: Share of the raw link speed a ring all-reduce reaches as bus bandwidth (nccl-tests, large messages).
BUSBW_EFFICIENCY = 0.8
#: PCIe paths through the CPU: share of the switch-local speed they reach.
PCIE_PATH_FACTOR: dict[str, float] = {"PIX": 1.0, "PXB": 1.0, "PHB": 0.6, "NODE": 0.6, "SYS": 0.4}
#: Measured bus bandwidth below this share of the promise is "far below".
BUSBW_WARN_RATIO = 0.4

#: Xid codes that point at the hardware (not at the application): from NVIDIA's Xid catalog.
HARDWARE_XIDS: dict[int, str] = {
    48: "double-bit ECC error", 61: "micro-controller breakpoint", 62: "micro-controller halt",
    63: "ECC page retirement or row remap", 64: "ECC page retirement or row remap failure",
    74: "NVLink error", 79: "GPU fell off the bus", 92: "high single-bit ECC rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
    140: "unrecovered ECC error",
}

#: Throttle reasons that slow a GPU for hardware reasons (idle, app clocks and power cap are normal).
SLOWDOWN_REASONS: tuple[str, ...] = (
    "HwSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown", "SwThermalSlowdown",
)
