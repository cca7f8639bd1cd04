"""The inter-node fabric: what share of the nodes' NIC line rate a ring collective reaches, by node count.

Ring all-reduce, reduce-scatter and all-gather cross each node once per ring, so on a network that
carries every flow at line rate their large-message bus bandwidth does not depend on how many nodes
the ring spans (NCCL's maintainers, NVIDIA/nccl#1712: "the bandwidth under the Ring algorithm was
basically the same for the maximum size" as nodes grew; only the latency, which comm.py prices per
ring step, grows with the ring). A fabric that places flows by hash instead (RoCE with plain ECMP,
AWS EFA) loses bus bandwidth as a ring spans more nodes: more flows share the spine and some hash onto
the same links, and the ring runs at its slowest link. The classes below are published nccl-tests
`all_reduce_perf` figures at 1-8 GiB, each point the measured bus bandwidth over the nodes' NIC line rate;
between points the share is interpolated in log(nodes), outside them held at the nearest point (never
extrapolated). Two-node figures are left out: NCCL runs the tree there, whose bus bandwidth can exceed
the NIC (nccl-tests#196, #22), so they do not measure the fabric.

- `ib` (default): a non-blocking InfiniBand fat tree with adaptive routing, the catalog's DGX/HGX
  build: the `network` prior (0.8) at every node count.
- `roce-ecmp`: RoCE with 5-tuple ECMP, 8 A100 and 8x 100 Gb/s RoCE a node (NVIDIA/nccl-tests#169):
  70, 58, 58 and 40 GB/s at 3, 4, 5 and 6 nodes of 100 GB/s. Meta's RoCE fabric (SIGCOMM 2024, "RDMA
  over Ethernet for Distributed AI Training at Meta Scale") gained "up to 40 %" on all-reduce from
  enhanced ECMP with QP scaling over baseline ECMP, i.e. baseline ECMP at ~0.57 of a 0.8 fabric,
  inside that series' range.
- `efa`: AWS EFA through aws-ofi-nccl. p4dn (8 A100, 4x 100 Gb/s EFA, NVIDIA/nccl#527): 31.8 and
  29.6 GB/s at 3 and 4 nodes of 50 GB/s; p3dn (8 V100, 100 Gb/s EFA, NVIDIA/nccl#235): 10 GB/s on 2
  nodes falling to 6-8 GB/s (0.48-0.64 of 12.5) from 8 to 32 nodes, taken as their midpoint 0.56.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from musubi.plan.errors import PlanError


@dataclass(frozen=True)
class FabricPoint:
    """One published nccl-tests figure: bus bandwidth across `nodes` nodes against the nodes' NIC line rate."""

    nodes: int
    busbw_gbps: float
    line_gbps: float
    source: str

    @property
    def share(self) -> float:
        """Measured bus bandwidth as a share of the node's NIC line rate."""
        return self.busbw_gbps / self.line_gbps


#: Published large-message all_reduce_perf bus bandwidth by node count (8 GPUs a node), per fabric class.
FABRIC_POINTS: dict[str, tuple[FabricPoint, ...]] = {
    "ib": (),
    "roce-ecmp": (
        FabricPoint(3, 70.0, 100.0, "NVIDIA/nccl-tests#169: 8x A100, 8x 100 Gb RoCE a node, all_reduce_perf 1-8 GiB"),
        FabricPoint(4, 58.0, 100.0, "NVIDIA/nccl-tests#169 (four or five servers: about 58 GB/s)"),
        FabricPoint(5, 58.0, 100.0, "NVIDIA/nccl-tests#169 (four or five servers: about 58 GB/s)"),
        FabricPoint(6, 40.0, 100.0, "NVIDIA/nccl-tests#169 (six servers: 40 GB/s)"),
    ),
    "efa": (
        FabricPoint(3, 31.77, 50.0, "NVIDIA/nccl#527: 3x p4dn.24xlarge (4x 100 Gb EFA), 1 GiB all_reduce_perf"),
        FabricPoint(4, 29.61, 50.0, "NVIDIA/nccl#527: 4x p4dn.24xlarge, 1 GiB"),
        FabricPoint(8, 7.0, 12.5, "NVIDIA/nccl#235: p3dn (100 Gb EFA), 6-8 GB/s from 8 to 32 nodes (midpoint)"),
        FabricPoint(32, 7.0, 12.5, "NVIDIA/nccl#235: p3dn, 6-8 GB/s from 8 to 32 nodes (midpoint)"),
    ),
}
FABRICS = tuple(FABRIC_POINTS)


def check_fabric(name: str) -> str:
    """The fabric class `name`, or a PlanError naming the classes there are."""
    if name not in FABRIC_POINTS:
        raise PlanError(f"--fabric {name}: unknown; give one of {', '.join(FABRICS)}")
    return name


def fabric_share(fabric: str, nodes: int, prior: float) -> float:
    """Share of the NIC line rate a ring across `nodes` nodes reaches on `fabric` (`prior`: the flat `network` share)."""
    points = FABRIC_POINTS[check_fabric(fabric)]
    if not points or nodes < 2:
        return prior
    if nodes <= points[0].nodes:
        return points[0].share
    if nodes >= points[-1].nodes:
        return points[-1].share
    for lo, hi in zip(points, points[1:], strict=False):
        if lo.nodes <= nodes <= hi.nodes:
            t = (math.log(nodes) - math.log(lo.nodes)) / (math.log(hi.nodes) - math.log(lo.nodes))
            return lo.share + t * (hi.share - lo.share)
    return points[-1].share  # unreachable: the points are sorted by nodes
