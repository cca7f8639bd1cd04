"""GPU-to-GPU links from `nvidia-smi topo -m`, the fallback when NVML cannot say (parsed by musubi.topology)."""

from __future__ import annotations

from musubi.topology.smi import parse_topo_matrix, read_topo_smi

__all__ = ["parse_topo_matrix", "read_topo_smi"]
