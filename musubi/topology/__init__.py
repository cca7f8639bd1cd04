"""One model of a node's topology: GPU-to-GPU links, NICs, CPU cores and NUMA nodes near each GPU.

Read from `nvidia-smi topo -m` text (live or recorded), NVML and sysfs; kept in
env.json; used by the preflight (bandwidth promise), the fleet packer (which
GPUs a job gets) and rank pinning (which cores a rank runs on). No torch here.
"""

from musubi.topology.model import GpuPlace, NicPlace, NodeTopology, link_cost, link_gbps

__all__ = ["GpuPlace", "NicPlace", "NodeTopology", "link_cost", "link_gbps"]
