"""Communication: which bandwidth tier a process group lands on, and what its collectives cost.

Tiers, fastest first: `nvlink` (the group fits one NVLink/NVSwitch domain), `pcie` (one
node, but past the NVLink domain), `network` (across nodes: InfiniBand/RoCE). Times use the
bus-bandwidth model of NCCL's ring (tree has the same bandwidth term): an all-reduce of S
bytes over n ranks moves 2 (n-1)/n S per rank, reduce-scatter and all-gather (n-1)/n S.
A network group with k members per node aggregates k NICs (NCCL's hierarchical rings), up
to the speed of the node's own links, for the bucketed gradient all-reduce and ZeRO-1/2
collectives. Weight-sharded (ZeRO-3 / FSDP) gathers and reduce-scatters are priced at each
GPU's own NIC instead (`Link.one_nic`), as Calculon prices every inter-node collective
(its A100 system: 25 GB/s per processor): see `one_nic` for why.

Latency of a ring that crosses nodes grows with its length: NCCL's own tuning model
(src/graph/tuning.cc, ring, Simple protocol) charges every all-gather / reduce-scatter
(n - nodes) intra-node hops and (nodes - 1) network hops; at thousands of ranks that is
milliseconds per collective, paid once per sharded unit per micro-batch (predict.py).
All-reduce keeps the tree latency (NCCL switches to tree at scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from musubi.plan.cluster import Cluster
from musubi.plan.efficiency import Efficiency

TIERS = ("nvlink", "pcie", "network")
#: NCCL's per-hop ring latencies (Simple protocol, tuning.cc), seconds: NVLink, PCIe, network.
RING_HOP_S = {"nvlink": 3.4e-6, "pcie": 5.7e-6, "network": 14e-6}


@dataclass(frozen=True)
class Link:
    """Where a group of `size` ranks lands and the bus bandwidth its ring collectives get (bytes/s)."""

    tier: str
    size: int
    busbw: float  # bytes/s per rank for ring collectives
    a2a_bw: float  # bytes/s per rank for all-to-all (NICs do not aggregate)
    latency_s: float
    local: int  # members of the group inside one node/NVLink domain
    ring_s: float = 0.0  # hop latency of one lap of a ring across nodes (0 inside a node)
    nic_bw: float = math.inf  # bytes/s of one GPU's own NIC (network tier only), no aggregation

    def one_nic(self) -> Link:
        """This link with its bus bandwidth capped at one GPU's NIC: the rate sharded weight traffic gets.

        NCCL's ring can spread a node's traffic over all its NICs, and the fit set's bucketed
        gradient all-reduces (gpt-1.7b..7.5b: 32 ranks, 8 per node) need that (at one NIC they
        come out 4-6 % slow). Per-unit ZeRO-3/FSDP gathers and scatters are a different pattern
        (thousands of collectives a step on the whole world, on a side stream, against compute);
        Calculon charges every inter-node collective one processor's NIC, and the only published
        sharded runs across nodes moved ~21-23 GB/s per A100 (one 200 Gb/s HDR NIC). No constant
        here is fitted: the rate is the catalog's nic_gbps x the `network` prior.
        """
        if self.tier != "network" or self.busbw <= self.nic_bw:
            return self
        return replace(self, busbw=self.nic_bw)


def _intra(cluster: Cluster, eff: Efficiency) -> tuple[str, float]:
    """The node-internal tier and its bandwidth (bytes/s): NVLink when it spans the node, else PCIe."""
    gpu = cluster.gpu
    if cluster.nvlink_domain >= min(cluster.gpus_per_node, cluster.n_gpus) and gpu.nvlink_gbps > 0 \
            and cluster.nvlink_domain > 1:
        return "nvlink", gpu.nvlink_gbps * 1e9 * eff.nvlink
    return "pcie", gpu.pcie_gbps * 1e9 * eff.pcie


def place_group(cluster: Cluster, eff: Efficiency, stride: int, size: int) -> Link:
    """The link of a group of `size` ranks spaced `stride` apart in rank order (tp stride 1, ...)."""
    gpu = cluster.gpu
    span = stride * size
    if size <= 1:
        return Link("nvlink", 1, math.inf, math.inf, 0.0, 1)
    if cluster.nvlink_domain > 1 and gpu.nvlink_gbps > 0 and span <= cluster.nvlink_domain:
        bw = gpu.nvlink_gbps * 1e9 * eff.nvlink
        return Link("nvlink", size, bw, bw, eff.latency_s["nvlink"], size)
    node = max(cluster.gpus_per_node, cluster.nvlink_domain)
    intra_tier, intra_bw = _intra(cluster, eff)
    if span <= node:
        bw = gpu.pcie_gbps * 1e9 * eff.pcie
        return Link("pcie", size, bw, bw, eff.latency_s["pcie"], size)
    local = max(1, min(size, node // stride))
    nic = gpu.nic_gbps * 1e9 * eff.network
    busbw = min(intra_bw, local * nic)
    # all-to-all: (local-1)/(size-1) of the traffic stays inside the node, the rest uses this GPU's NIC.
    inside = (local - 1) / (size - 1)
    a2a = 1.0 / (inside / intra_bw + (1 - inside) / nic)
    depth = 1 + math.log2(max(2, size // local))  # tree/ring steps across nodes
    nodes = -(-size // local)
    ring = (size - nodes) * RING_HOP_S[intra_tier] + (nodes - 1) * RING_HOP_S["network"]
    return Link("network", size, busbw, a2a, eff.latency_s["network"] * depth, local, ring, nic)


def all_reduce_s(nbytes: float, link: Link) -> float:
    """Ring all-reduce of `nbytes` per rank."""
    if link.size <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (link.size - 1) / link.size * nbytes / link.busbw + link.latency_s


def reduce_scatter_s(nbytes: float, link: Link) -> float:
    """Reduce-scatter of an `nbytes` buffer per rank (the same as all-gather into one); ring only."""
    if link.size <= 1 or nbytes <= 0:
        return 0.0
    return (link.size - 1) / link.size * nbytes / link.busbw + link.latency_s + link.ring_s


all_gather_s = reduce_scatter_s


def all_to_all_s(nbytes: float, link: Link) -> float:
    """All-to-all where each rank sends `nbytes` in total, spread evenly over the group."""
    if link.size <= 1 or nbytes <= 0:
        return 0.0
    return (link.size - 1) / link.size * nbytes / link.a2a_bw + link.latency_s


def p2p_s(nbytes: float, link: Link) -> float:
    """One point-to-point send of `nbytes` between neighbouring pipeline stages."""
    if link.size <= 1 or nbytes <= 0:
        return 0.0
    # A send uses one GPU's own link: the NIC for a cross-node stage boundary, no aggregation.
    bw = link.a2a_bw if link.tier == "network" else link.busbw
    return nbytes / bw + link.latency_s
