"""The topology of one node: how each GPU pair is linked, which NICs and cores sit near each GPU.

Links are spelled as `nvidia-smi topo -m` spells them (best first): NV# (a
bonded set of # NVLinks, direct or through NVSwitch), PIX (at most one PCIe
bridge), PXB (several PCIe bridges, no host bridge), PHB (through a PCIe host
bridge, i.e. the CPU), NODE (between host bridges of one NUMA node), SYS
(across the inter-socket link, QPI/UPI/xGMI).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from musubi.contract.run_files import RUN_FILES

#: Rough usable GB/s per direction of each PCIe path, for a PCIe gen4 x16 card (31.5 GB/s raw):
#: only the order and the ratios matter to the packer (a host bridge or the socket link costs bandwidth).
PCIE_PATH_GBPS: dict[str, float] = {"PIX": 24.0, "PXB": 22.0, "PHB": 15.0, "NODE": 13.0, "SYS": 10.0}
#: GB/s per direction of one NVLink (NVLink 3/4; NV18 on H100/H200 is 18 of them).
NVLINK_GBPS = 25.0

_NV = re.compile(r"NV(\d+)$")


def link_gbps(link: str | None) -> float:
    """Estimated GB/s of a link word (NV18, PIX, ..., SYS); an unknown link counts as the slowest (SYS)."""
    if link:
        m = _NV.match(link)
        if m:
            return NVLINK_GBPS * int(m.group(1))
        if link in PCIE_PATH_GBPS:
            return PCIE_PATH_GBPS[link]
    return PCIE_PATH_GBPS["SYS"]


def link_cost(link: str | None) -> float:
    """Seconds per GB over a link (1 / GB/s): the packer's pairwise cost, lower is better."""
    return 1.0 / link_gbps(link)


def parse_cpulist(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' (sysfs / nvidia-smi CPU affinity) -> (0, 1, 2, 3, 8, 10, 11); '' or 'N/A' -> ()."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part or not part[0].isdigit():
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(set(out)))


def format_cpulist(cpus: tuple[int, ...] | list[int] | set[int] | frozenset[int]) -> str:
    """(0, 1, 2, 3, 8) -> '0-3,8' (the inverse of parse_cpulist)."""
    xs = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class GpuPlace:
    """Where one GPU sits: its CPU affinity and NUMA node (nvidia-smi index)."""

    index: int
    cpus: tuple[int, ...] = ()  # logical CPUs nearest the GPU (its NUMA node's), () if unknown
    numa: int | None = None  # NUMA node of the GPU's PCIe root, None if unknown (VMs often say N/A)
    bus_id: str = ""


@dataclass(frozen=True)
class NicPlace:
    """A network card (e.g. 'mlx5_0') and its link to each GPU."""

    name: str
    links: dict[int, str] = field(default_factory=dict)  # GPU index -> link word


@dataclass(frozen=True)
class NodeTopology:
    """How the GPUs of one node connect, and what sits near each (the one topology model of Musubi).

    `links` holds each GPU pair once, as (i, j) with i < j (nvidia-smi indices). A reading that
    knows nothing (no GPU, no nvidia-smi) is empty, not an error.
    """

    links: dict[tuple[int, int], str] = field(default_factory=dict)
    p2p: dict[tuple[int, int], str] = field(default_factory=dict)  # 'OK' or why peer access is off
    source: str = "none"  # 'nvml', 'nvidia-smi', 'recorded:<path>' or 'none'
    gpus: tuple[GpuPlace, ...] = ()
    nics: tuple[NicPlace, ...] = ()
    text: str = ""  # the `nvidia-smi topo -m` text it was read from, if any (kept so it can be re-read)

    def link(self, a: int, b: int) -> str | None:
        """The link between GPUs a and b, if known."""
        return self.links.get((min(a, b), max(a, b)))

    def p2p_status(self, a: int, b: int) -> str | None:
        """Peer-to-peer status between GPUs a and b ('OK' or a reason), if known."""
        return self.p2p.get((min(a, b), max(a, b)))

    def cost(self, a: int, b: int) -> float:
        """Pairwise link cost (s/GB) between two GPUs; unknown links cost as much as SYS."""
        return link_cost(self.link(a, b))

    @property
    def gpu_indices(self) -> list[int]:
        """Every GPU the reading names, from the GPU list or the links."""
        if self.gpus:
            return [g.index for g in self.gpus]
        return sorted({i for pair in self.links for i in pair})

    def gpu(self, index: int) -> GpuPlace | None:
        """The place of GPU `index`, if the reading has it."""
        return next((g for g in self.gpus if g.index == index), None)

    def numa_of(self, index: int) -> int | None:
        """NUMA node of GPU `index` (None if unknown)."""
        g = self.gpu(index)
        return g.numa if g is not None else None

    def nearest_nics(self, index: int) -> list[str]:
        """The NICs closest to GPU `index` (best link class first; ties kept)."""
        ranked = [(link_cost(n.links.get(index)), n.name) for n in self.nics if index in n.links]
        if not ranked:
            return []
        best = min(c for c, _ in ranked)
        return [name for c, name in ranked if c == best]

    def nvlink_domain(self) -> int:
        """Size of the largest group of GPUs whose every pair is NVLink-connected (1 without NVLink)."""
        idx = self.gpu_indices
        best = 1 if idx else 0
        # Greedy cliques from each GPU suffice for the shapes nodes have (pairs, quads, NVSwitch).
        for start in idx:
            clique = [start]
            for other in idx:
                if other != start and all((self.link(other, c) or "").startswith("NV") for c in clique):
                    clique.append(other)
            best = max(best, len(clique))
        return best

    def summary(self) -> str:
        """One line: GPUs, link classes with counts, NUMA nodes, NICs."""
        if not self.links and not self.gpus:
            return "unknown"
        counts: dict[str, int] = {}
        for link in self.links.values():
            counts[link] = counts.get(link, 0) + 1
        links = ", ".join(f"{n}x{k}" for k, n in sorted(counts.items(), key=lambda kv: -link_gbps(kv[0])))
        numa = sorted({g.numa for g in self.gpus if g.numa is not None})
        parts = [f"{len(self.gpu_indices)} GPUs", f"pairs {links or 'none'}"]
        if numa:
            parts.append("NUMA " + ",".join(str(n) for n in numa))
        if self.nics:
            parts.append("NICs " + ",".join(n.name for n in self.nics))
        return "; ".join(parts) + f" (from {self.source})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (what env.json records under `topology`)."""
        return {
            "source": self.source,
            "gpus": [{"index": g.index, "numa": g.numa, "cpus": format_cpulist(g.cpus), "bus_id": g.bus_id}
                     for g in self.gpus],
            "links": {f"gpu{a}-gpu{b}": link for (a, b), link in sorted(self.links.items())},
            "p2p": {f"gpu{a}-gpu{b}": s for (a, b), s in sorted(self.p2p.items())},
            "nics": [{"name": n.name, "links": {f"gpu{i}": v for i, v in sorted(n.links.items())}} for n in self.nics],
            "text": self.text,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeTopology:
        """Inverse of to_dict (also reads the older env.json form: a bare {'gpu0-gpu1': 'NV18'} mapping)."""
        if "links" not in data:  # env.json before the topology model: only pair -> link
            data = {"source": RUN_FILES.env, "links": data}

        def pair(key: str) -> tuple[int, int]:
            parts = str(key).split("-")
            if len(parts) != 2 or not all(x.removeprefix("gpu").isdigit() for x in parts):
                raise ValueError(f"{key!r} is not a GPU pair like 'gpu0-gpu1'")
            a, b = (int(x.removeprefix("gpu")) for x in parts)
            return (min(a, b), max(a, b))

        return cls(
            links={pair(k): v for k, v in data.get("links", {}).items()},
            p2p={pair(k): v for k, v in data.get("p2p", {}).items()},
            source=str(data.get("source", RUN_FILES.env)),
            gpus=tuple(GpuPlace(int(g["index"]), parse_cpulist(str(g.get("cpus") or "")), g.get("numa"),
                                str(g.get("bus_id") or "")) for g in data.get("gpus", [])),
            nics=tuple(NicPlace(str(n["name"]), {int(k.removeprefix("gpu")): v for k, v in n.get("links", {}).items()})
                       for n in data.get("nics", [])),
            text=str(data.get("text") or ""),
        )
