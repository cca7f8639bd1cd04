"""The recorded `nvidia-smi topo -m` texts of tests/topology/fixtures, parsed."""

from __future__ import annotations

from pathlib import Path

from musubi.topology.model import NodeTopology
from musubi.topology.smi import parse_topo_matrix

FIXTURES = Path(__file__).parent / "fixtures"
#: 8 PCIe cards, one PCIe switch per socket, two sockets (PIX pairs, PXB within a switch, SYS across).
PCIE8 = "pcie8_two_switches.txt"
#: 8 cards in 4 NVLink-bridged pairs (NV4), PCIe NODE within a socket and SYS across.
PAIRS8 = "nvlink_pairs8.txt"
#: 8 SXM cards on NVSwitch (NV18 everywhere), 4 NICs.
NVSWITCH8 = "nvswitch8.txt"
#: 4 cards, all-to-all NVLink (NV18), two NUMA nodes.
NVLINK4 = "nvlink4_all.txt"
ALL = (PCIE8, PAIRS8, NVSWITCH8, NVLINK4)


def recorded(name: str) -> NodeTopology:
    """A fixture parsed into the topology model."""
    return parse_topo_matrix((FIXTURES / name).read_text())
