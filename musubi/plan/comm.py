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

One call of a collective costs (`collective_s`): the time of NCCL's cheapest protocol for its
size, NCCL's own tuning model (src/graph/tuning.cc at NVIDIA/nccl b647562): a base latency, a
latency per ring step (per tree level for all-reduce) of the tier it crosses, and the bytes at
the protocol's share of the bus bandwidth (LL 1/4 or 1/3, LL128 0.92, Simple 1); and never less
than the framework's per-call floor (`Efficiency.call_s`: what a call through torch.distributed
costs back to back, measured on 2 H200). So the effective bandwidth is a saturating curve of the
message size (latency + bytes / bandwidth), not one fraction. All-gather and reduce-scatter inside
a node reach `Efficiency.gather_share` of all-reduce's bus bandwidth (measured). At thousands of
ranks a ring's hops cost milliseconds per collective, paid once per sharded unit per micro-batch
(predict.py); all-reduce takes NCCL's tree when it is cheaper.
Check: bench/nccl_sweep.py on 2 H200 (BENCHMARKS.md, planner; tests/plan/test_collective_curve.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from musubi.plan.cluster import Cluster
from musubi.plan.efficiency import Efficiency
from musubi.plan.fabric import fabric_share

TIERS = ("nvlink", "pcie", "network")


@dataclass(frozen=True)
class Protocol:
    """One of NCCL's protocols as its tuning model prices it (src/graph/tuning.cc, NVIDIA/nccl b647562)."""

    name: str
    ring_base_s: float  # baseLat, ring
    tree_base_s: float  # baseLat, tree
    ring_hop_s: dict[str, float]  # hwLat per ring step, by tier
    tree_hop_s: dict[str, float]  # hwLat per tree level, by tier
    share: float  # of the Simple protocol's bus bandwidth (LL: see `bandwidth_share`)
    net_overhead_s: float  # per step of a ring that crosses nodes (getNetOverhead: 1 us, x3 for Simple)


#: LL: 8-byte stores with a flag (half the payload, and NCCL's model takes 1/4 for all-reduce or across
#: nodes, 1/3 otherwise); LL128: 120 of 128 bytes (0.92); Simple: the full rate, the largest latency.
PROTOCOLS = (
    Protocol("LL", 6.6e-6, 6.8e-6, {"nvlink": 0.6e-6, "pcie": 1.0e-6, "network": 2.7e-6},
             {"nvlink": 0.6e-6, "pcie": 1.0e-6, "network": 5.0e-6}, 0.25, 1e-6),
    Protocol("LL128", 14e-6, 14e-6, {"nvlink": 1.9e-6, "pcie": 2.5e-6, "network": 4.0e-6},
             {"nvlink": 1.25e-6, "pcie": 1.9e-6, "network": 8.5e-6}, 0.92, 1e-6),
    Protocol("Simple", 8.4e-6, 0.0, {"nvlink": 3.4e-6, "pcie": 5.7e-6, "network": 14e-6},
             {"nvlink": 28e-6, "pcie": 28e-6, "network": 28e-6}, 1.0, 3e-6),
)
#: NCCL's per-hop ring latencies (Simple protocol), seconds: NVLink, PCIe, network.
RING_HOP_S = PROTOCOLS[-1].ring_hop_s
#: NCCL's tree bandwidth against the ring's (tuning.cc: busBw x 0.92 for tree).
TREE_SHARE = 0.92


@dataclass(frozen=True)
class Link:
    """Where a group of `size` ranks lands and the bus bandwidth its ring collectives get (bytes/s)."""

    tier: str
    size: int
    busbw: float  # bytes/s per rank for ring collectives
    a2a_bw: float  # bytes/s per rank for all-to-all (NICs do not aggregate)
    latency_s: float
    local: int  # members of the group inside one node/NVLink domain
    nic_bw: float = math.inf  # bytes/s of one GPU's own NIC (network tier only), no aggregation
    intra: str = "nvlink"  # the tier of the hops inside a node (nvlink or pcie)
    call_s: float = 0.0  # framework floor of one all-reduce call (Efficiency.call_s)
    gather_call_s: float = 0.0  # the same for all-gather / reduce-scatter
    gather_share: float = 1.0  # all-gather / reduce-scatter bus bandwidth against all-reduce's

    @property
    def nodes(self) -> int:
        """Nodes the group spans (1 inside a node)."""
        return -(-self.size // self.local) if self.tier == "network" else 1

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


def network_share(cluster: Cluster, eff: Efficiency, nodes: int) -> float:
    """Share of the NIC line rate a ring across `nodes` nodes gets: measured (--calibrate), else the fabric's."""
    if "network" in eff.measured:
        return eff.network
    return fabric_share(cluster.fabric, nodes, eff.network)


def place_group(cluster: Cluster, eff: Efficiency, stride: int, size: int) -> Link:
    """The link of a group of `size` ranks spaced `stride` apart in rank order (tp stride 1, ...)."""
    gpu = cluster.gpu
    span = stride * size
    calls = {"call_s": eff.call_s["all_reduce"], "gather_call_s": eff.call_s["all_gather"]}
    if size <= 1:
        return Link("nvlink", 1, math.inf, math.inf, 0.0, 1)
    if cluster.nvlink_domain > 1 and gpu.nvlink_gbps > 0 and span <= cluster.nvlink_domain:
        bw = gpu.nvlink_gbps * 1e9 * eff.nvlink
        return Link("nvlink", size, bw, bw, eff.latency_s["nvlink"], size, gather_share=eff.gather_share, **calls)
    node = max(cluster.gpus_per_node, cluster.nvlink_domain)
    intra_tier, intra_bw = _intra(cluster, eff)
    if span <= node:
        bw = gpu.pcie_gbps * 1e9 * eff.pcie
        return Link("pcie", size, bw, bw, eff.latency_s["pcie"], size, intra="pcie",
                    gather_share=eff.gather_share, **calls)
    local = max(1, min(size, node // stride))
    nic = gpu.nic_gbps * 1e9 * network_share(cluster, eff, -(-size // local))
    busbw = min(intra_bw, local * nic)
    # all-to-all: (local-1)/(size-1) of the traffic stays inside the node, the rest uses this GPU's NIC.
    inside = (local - 1) / (size - 1)
    a2a = 1.0 / (inside / intra_bw + (1 - inside) / nic)
    depth = 1 + math.log2(max(2, size // local))  # tree/ring steps across nodes
    # Across nodes the ring's bandwidth is the NICs' (measured there as all-gathers of sharded runs: one_nic), so
    # gather_share (measured inside a node) does not apply.
    return Link("network", size, busbw, a2a, eff.latency_s["network"] * depth, local, nic, intra=intra_tier,
                **calls)


def bandwidth_share(protocol: Protocol, all_reduce: bool, link: Link) -> float:
    """The share of the link's Simple bus bandwidth a protocol reaches (tuning.cc's LL: 1/4 or 1/3)."""
    if protocol.name == "LL" and not all_reduce and link.tier != "network":
        return 1 / 3
    if protocol.name == "LL128" and link.tier == "network" and link.local < 2:
        return 0.7  # one GPU a node sends and receives through the same NIC (tuning.cc: ppn < 2)
    return protocol.share


def ring_latency_s(protocol: Protocol, all_reduce: bool, link: Link) -> float:
    """NCCL's ring latency of one call: base + intra-node steps + network steps (tuning.cc)."""
    steps = 2 * (link.size - 1) if all_reduce else link.size - 1
    nodes = link.nodes
    inter = (2 * nodes if all_reduce else nodes - 1) if nodes > 1 else 0
    inter = min(inter, steps)
    intra = protocol.ring_hop_s[link.intra]
    if nodes > 1:  # a ring that crosses nodes posts network work every step
        intra = max(intra, protocol.net_overhead_s)
    return protocol.ring_base_s + (steps - inter) * intra + inter * protocol.ring_hop_s["network"]


def tree_latency_s(protocol: Protocol, link: Link) -> float:
    """NCCL's tree all-reduce latency: up and down the node's chain and log2(nodes) network levels."""
    nodes = link.nodes
    per_node = link.size // nodes if nodes > 1 else link.size
    levels = (per_node - 1) * protocol.tree_hop_s[link.intra] + math.log2(nodes) * protocol.tree_hop_s["network"]
    return protocol.tree_base_s + 2 * levels


def collective_s(wire_bytes: float, link: Link, all_reduce: bool) -> float:
    """One call moving `wire_bytes` per rank: NCCL's cheapest protocol (and algorithm), never under the call floor."""
    if all_reduce:
        busbw, floor = link.busbw, link.call_s
    else:
        busbw, floor = link.busbw * link.gather_share, link.gather_call_s
    best = math.inf
    for protocol in PROTOCOLS:
        if protocol.name == "LL128" and link.intra != "nvlink":
            continue  # NCCL enables LL128 only over NVLink
        bw = busbw * bandwidth_share(protocol, all_reduce, link)
        best = min(best, ring_latency_s(protocol, all_reduce, link) + wire_bytes / bw)
        if all_reduce and link.size > 2:
            best = min(best, tree_latency_s(protocol, link) + wire_bytes / (bw * TREE_SHARE))
    return max(floor, best)


def all_reduce_s(nbytes: float, link: Link) -> float:
    """All-reduce of `nbytes` per rank (ring moves 2 (n-1)/n of it; the tree when NCCL would pick it)."""
    if link.size <= 1 or nbytes <= 0:
        return 0.0
    return collective_s(2 * (link.size - 1) / link.size * nbytes, link, all_reduce=True)


def reduce_scatter_s(nbytes: float, link: Link) -> float:
    """Reduce-scatter of an `nbytes` buffer per rank (the same as all-gather into one); ring only."""
    if link.size <= 1 or nbytes <= 0:
        return 0.0
    return collective_s((link.size - 1) / link.size * nbytes, link, all_reduce=False)


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
