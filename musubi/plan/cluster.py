"""The machines a job runs on: a catalog GPU, how many, and how they group into nodes."""

from __future__ import annotations

from dataclasses import dataclass, replace

from musubi.plan.catalog import GPU
from musubi.plan.errors import PlanError
from musubi.plan.fabric import check_fabric
from musubi.topology.model import NodeTopology, link_gbps


@dataclass(frozen=True)
class Cluster:
    """n_gpus of one GPU type, gpus_per_node to a node (NVLink domains may span nodes: NVL72), on a fabric class."""

    gpu: GPU
    n_gpus: int
    gpus_per_node: int
    fabric: str = "ib"  # the inter-node fabric class (fabric.FABRICS): how bus bandwidth holds up with nodes

    @property
    def nodes(self) -> int:
        """Number of nodes."""
        return -(-self.n_gpus // self.gpus_per_node)

    @property
    def nvlink_domain(self) -> int:
        """GPUs that share NVLink at full bandwidth (1: none), capped by the cluster size."""
        return min(self.gpu.nvlink_domain, self.n_gpus)


def make_cluster(gpu: GPU, n_gpus: int, nodes: int | None = None, fabric: str = "ib") -> Cluster:
    """A cluster of `n_gpus`; `nodes` (when given) sets GPUs per node, else the catalog's node size; `fabric`: FABRICS."""
    if n_gpus < 1:
        raise PlanError(f"--gpus {n_gpus}: must be >= 1")
    check_fabric(fabric)
    if nodes is None:
        return Cluster(gpu, n_gpus, min(gpu.gpus_per_node, n_gpus), fabric)
    if nodes < 1 or n_gpus % nodes:
        raise PlanError(f"--nodes {nodes} does not divide --gpus {n_gpus}; give GPUs per node x nodes")
    per_node = n_gpus // nodes
    if per_node > gpu.gpus_per_node and gpu.nvlink_domain < per_node:
        raise PlanError(f"--gpus {n_gpus} on --nodes {nodes} is {per_node} GPUs per node; a {gpu.name} "
                        f"node holds {gpu.gpus_per_node}")
    return Cluster(gpu, n_gpus, per_node, fabric)


def fit_to_topology(gpu: GPU, topo: NodeTopology) -> GPU:
    """The catalog GPU on a measured node (musubi.topology): its GPUs per node, NVLink domain and NVLink speed."""
    n = len(topo.gpu_indices)
    if n == 0:
        raise PlanError("the topology names no GPU; give `nvidia-smi topo -m` output or an env.json of a GPU node")
    domain = topo.nvlink_domain()
    nv = [link_gbps(link) for link in topo.links.values() if link.startswith("NV")]
    # NVLink GB/s per direction of the weakest NVLink pair (bridged pairs: NV4 is 100 GB/s, not the catalog's SXM).
    return replace(gpu, gpus_per_node=n, nvlink_domain=domain, nvlink_gbps=min(nv) if nv else gpu.nvlink_gbps)
