"""Plain readings of the machine, gathered by `preflight.read` and judged by `preflight.checks`.

Checks never read the machine themselves: everything they judge arrives here,
so a test can hand them any machine (a Blackwell card on an old build, a GPU
half full of someone else's tensors) by building these dataclasses. The GPU readings (GpuReading,
NvmlReading) live with their reader in musubi.topology.nvml, which the topology reader shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musubi.topology.model import NodeTopology


@dataclass(frozen=True)
class StackReading:
    """The software stack: torch build, CUDA runtime, NCCL, driver."""

    torch_version: str
    cuda_version: str | None  # torch.version.cuda; None on a CPU-only build
    arch_list: tuple[str, ...]  # torch.cuda.get_arch_list(): 'sm_90', 'compute_90', ...
    cuda_available: bool
    cuda_device_count: int  # GPUs torch sees (CUDA_VISIBLE_DEVICES applied)
    cuda_error: str | None  # why CUDA did not initialise, if torch said
    nccl_available: bool
    nccl_version: str | None
    gloo_available: bool
    driver_version: str | None  # from NVML, e.g. '570.124.06'
    driver_cuda_version: str | None  # newest CUDA the driver supports natively, e.g. '12.8'


#: How each pair of GPUs is connected, in `nvidia-smi topo -m` words (NV18, PIX, PXB, PHB, NODE, SYS), with
#: P2P status, NICs and CPU affinity: the one topology model (musubi.topology), also read by the packer.
TopologyReading = NodeTopology


@dataclass(frozen=True)
class CommReading:
    """What the timed all-reduce across the requested devices measured."""

    backend: str  # 'nccl' or 'gloo'
    ranks: int
    nbytes: int = 0  # bytes per rank per all-reduce
    seconds: float | None = None  # per all-reduce, slowest rank
    busbw_gbps: float | None = None  # bus bandwidth, GB/s (nccl-tests convention: algbw x 2(n-1)/n)
    correct: bool | None = None  # every rank got the exact sum
    transports: tuple[str, ...] = ()  # NCCL transports seen in its log: 'P2P', 'SHM', 'NET'
    error: str | None = None
    timed_out: bool = False
    timeout_s: float = 0.0
    log_path: str | None = None
    launcher: str = "torchrun"  # 'single' (one process drives every GPU) or 'torchrun' (a process per rank)
    wall_s: float | None = None  # the probe's whole time: process start, imports, NCCL init, timing


@dataclass(frozen=True)
class DiskReading:
    """Free space where the run directory goes."""

    path: Path  # as asked
    probed: Path  # nearest existing ancestor (the run directory may not exist yet)
    free_bytes: int = 0
    total_bytes: int = 0
    writable: bool = True
    error: str | None = None


@dataclass(frozen=True)
class EnvReading:
    """The variables that steer NCCL, CUDA and threads, and the shape of the job."""

    variables: dict[str, str]
    nodes: int = 1
    ranks_per_node: int = 1
    cpu_count: int = 1
    gpu_names: tuple[str, ...] = ()  # all GPUs of the machine (for device-order traps)


@dataclass(frozen=True)
class DataIssue:
    """One kind of problem in a dataset: how many, and the first offenders."""

    kind: str  # missing | undecodable | empty_box | box_outside | size_mismatch | empty_class | ...
    count: int
    examples: tuple[str, ...]


@dataclass(frozen=True)
class DataReading:
    """What reading one dataset found: its kind, counts, and problems."""

    target: str  # as given (--data)
    kind: str  # coco | image_folder | text | missing
    path: str = ""  # annotation file, folder root or text file
    image_dir: str | None = None  # COCO image directory
    error: str | None = None  # structural problem that stops reading (one line)
    fix: str = ""  # how to fix `error`
    counts: dict[str, int] = field(default_factory=dict)
    issues: tuple[DataIssue, ...] = ()
    categories: tuple[str, ...] = ()  # COCO category names or folder classes
    seconds: float = 0.0
    per_class: dict[str, int] = field(default_factory=dict)  # COCO: boxes per category name (crowd excluded)
    pixels: dict[str, Any] | None = None  # COCO of single-channel frames: musubi.data.pixels.PixelStats as a dict
