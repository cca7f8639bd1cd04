"""Readings of the torch stack, the environment variables and the disk."""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path

from musubi.contract.env import MUSUBI_NNODES
from musubi.preflight.readings import DiskReading, EnvReading, StackReading
from musubi.topology.nvml import NvmlReading

#: Variables the environment check looks at (prefixes and exact names).
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "CUDA_", "OMP_", "PYTORCH_", "TORCH_CPP_LOG")
ENV_NAMES = ("MKL_NUM_THREADS", "MASTER_ADDR", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GLOO_SOCKET_IFNAME")
_NODE_VARS = (MUSUBI_NNODES, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "PET_NNODES", "NNODES")


def torch_side() -> dict:
    """torch's part of the stack reading (build, CUDA availability and count, NCCL, gloo): StackReading's fields
    less the driver's. Taken wherever torch is imported: the launcher's warm spare reads it for the preflight."""
    import torch
    import torch.distributed as dist

    with warnings.catch_warnings(record=True) as caught:
        # torch reports a failed CUDA init ("driver too old", "no kernel image") as a warning, not an error.
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    cuda_error = next((str(w.message).splitlines()[0] for w in caught if "CUDA" in str(w.message)), None)
    nccl_version = None
    nccl = dist.is_available() and dist.is_nccl_available()
    if nccl:
        try:
            v = torch.cuda.nccl.version()
            nccl_version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except (AttributeError, RuntimeError):
            nccl_version = None
    return {"torch_version": torch.__version__, "cuda_version": torch.version.cuda,
            "arch_list": list(torch.cuda.get_arch_list()) if available else [], "cuda_available": available,
            "cuda_device_count": count, "cuda_error": cuda_error, "nccl_available": nccl,
            "nccl_version": nccl_version, "gloo_available": dist.is_available() and dist.is_gloo_available()}


def read_stack(nvml: NvmlReading, torch_read: dict | None = None) -> StackReading:
    """torch build (CUDA version, arch list), CUDA availability, NCCL/gloo, and the driver from NVML; `torch_read`:
    torch's part as another process read it (torch_side), else read here."""
    side = dict(torch_side() if torch_read is None else torch_read)
    side["arch_list"] = tuple(side["arch_list"])
    return StackReading(**side, driver_version=nvml.driver_version, driver_cuda_version=nvml.driver_cuda_version)


def _first_int(text: str) -> int | None:
    m = re.search(r"\d+", text)
    return int(m.group()) if m else None


def nodes_from_env(env: Mapping[str, str]) -> int:
    """Nodes of the job as the launcher or scheduler tells it (1 when nothing says)."""
    for name in _NODE_VARS:
        if name in env:
            # PET_NNODES may be an elastic range "2:4": the upper bound is what the job may reach.
            values = [int(v) for v in re.findall(r"\d+", env[name])]
            if values:
                return max(values)
    world, local = _first_int(env.get("WORLD_SIZE", "")), _first_int(env.get("LOCAL_WORLD_SIZE", ""))
    if world and local:
        return max(1, world // local)
    return 1


def read_env(ranks_per_node: int, nvml: NvmlReading, env: Mapping[str, str] | None = None) -> EnvReading:
    """The NCCL/CUDA/thread variables in force, the number of nodes, cores and GPU models."""
    env = os.environ if env is None else env
    from musubi.store.redact import redact_env

    # Redacted: these readings are printed and written to preflight.json.
    picked = redact_env({k: v for k, v in env.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES})
    return EnvReading(
        variables=dict(sorted(picked.items())),
        nodes=nodes_from_env(env),
        ranks_per_node=ranks_per_node,
        cpu_count=os.cpu_count() or 1,
        gpu_names=tuple(g.name for g in nvml.gpus if g.error is None),
    )


def read_disk(path: Path) -> DiskReading:
    """Free and total bytes on the file system that will hold `path` (which may not exist yet)."""
    probed = path.absolute()
    while not probed.exists() and probed != probed.parent:
        probed = probed.parent
    try:
        usage = shutil.disk_usage(probed)
    except OSError as e:
        return DiskReading(path=path, probed=probed, writable=False, error=f"{type(e).__name__}: {e}")
    writable = probed.is_dir() and os.access(probed, os.W_OK | os.X_OK)
    return DiskReading(path=path, probed=probed, free_bytes=usage.free, total_bytes=usage.total, writable=writable)
