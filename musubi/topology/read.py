"""Reading a node's topology: live (nvidia-smi, else NVML + sysfs) or from a recorded file."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from musubi.contract.errors import ConfigError
from musubi.topology.model import GpuPlace, NodeTopology, parse_cpulist
from musubi.topology.nvml import NvmlReading, read_nvml
from musubi.topology.smi import parse_topo_matrix, read_topo_text

SYSFS_PCI = Path("/sys/bus/pci/devices")
_PAIR = re.compile(r"gpu\d+-gpu\d+")


def _sysfs_place(index: int, bus_id: str) -> GpuPlace:
    """NUMA node and local CPUs of a PCI device from sysfs (NVML's '00000000:18:00.0' -> '0000:18:00.0')."""
    dom, _, rest = bus_id.lower().partition(":")
    dev = SYSFS_PCI / f"{dom[-4:]}:{rest}"
    numa: int | None = None
    cpus: tuple[int, ...] = ()
    try:
        n = int((dev / "numa_node").read_text().strip())
        numa = n if n >= 0 else None  # -1: the platform does not say (VMs)
    except (OSError, ValueError):
        pass
    try:
        cpus = parse_cpulist((dev / "local_cpulist").read_text())
    except OSError:
        pass
    return GpuPlace(index, cpus, numa, bus_id)


def read_node_topology() -> NodeTopology:
    """This machine's topology: `nvidia-smi topo -m` (links, NICs, affinity), else NVML links + sysfs NUMA."""
    nvml, topo = read_nvml(with_xids=False)
    text = read_topo_text() if nvml.gpus else None
    smi = parse_topo_matrix(text) if text else NodeTopology()
    buses = {g.index: g.pci_bus_id for g in nvml.gpus}
    if smi.links or smi.gpus:
        # nvidia-smi knows NICs and affinity; NVML adds P2P status and bus ids.
        gpus = tuple(replace(g, bus_id=buses.get(g.index, "")) for g in smi.gpus)
        return replace(smi, p2p=topo.p2p, gpus=gpus)
    return with_sysfs_places(nvml, topo)


def with_sysfs_places(nvml: NvmlReading, topo: NodeTopology) -> NodeTopology:
    """NVML's link reading with each GPU's NUMA node and local CPUs from sysfs (when it has no GPU places)."""
    if topo.gpus:
        return topo
    places = tuple(_sysfs_place(g.index, g.pci_bus_id) for g in nvml.gpus if g.error is None)
    return replace(topo, gpus=places)


def load_topology(path: Path) -> NodeTopology:
    """A recorded topology: `nvidia-smi topo -m` text, or a JSON file (env.json or a `topology` dict)."""
    try:
        raw = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"topology file {path}: cannot be read ({e.strerror}); give a `nvidia-smi topo -m` "
                          "text or an env.json") from None
    if raw.lstrip().startswith("{"):
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise ConfigError(f"topology file {path}: not valid JSON ({e}); give a `nvidia-smi topo -m` text "
                              "or an env.json") from None
        if not isinstance(data, dict):
            raise ConfigError(f"topology file {path}: JSON but not an object; give a `nvidia-smi topo -m` text or "
                              "an env.json written on a GPU machine")
        if "topology" in data:
            data = data["topology"]
        elif not ("links" in data or (data and all(_PAIR.fullmatch(str(k)) for k in data))):
            raise ConfigError(f"topology file {path}: JSON without a `topology` (an env.json written on a machine "
                              "without GPUs or NVML?); give `nvidia-smi topo -m` text saved on the GPU machine, or "
                              "an env.json written there")
        try:
            topo = NodeTopology.from_dict(data) if isinstance(data, dict) else NodeTopology()
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"topology file {path}: its `topology` is not in env.json's form ({e}); give "
                              "`nvidia-smi topo -m` text or an env.json written on a GPU machine") from None
        if topo.text and not topo.gpus:  # an older record: re-read the text it kept
            topo = parse_topo_matrix(topo.text)
    else:
        topo = parse_topo_matrix(raw)
    if not topo.links and not topo.gpus:
        raise ConfigError(f"topology file {path}: no GPU found in it; give the output of `nvidia-smi topo -m` "
                          "or an env.json written on a GPU machine")
    return replace(topo, source=f"recorded:{path.name}")


def env_topology(env_path: Path) -> NodeTopology | None:
    """The topology a run's env.json recorded (the machine it was written on), None when it holds none."""
    try:
        rec = json.loads(env_path.read_text(encoding="utf-8")).get("topology")
        if isinstance(rec, dict) and rec.get("links"):
            return NodeTopology.from_dict(rec)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def numa_nodes(topo: NodeTopology) -> dict[int, int | None]:
    """GPU index -> NUMA node (None where unknown), from the model's GPU places."""
    return {g.index: g.numa for g in topo.gpus}


__all__ = ["env_topology", "load_topology", "numa_nodes", "parse_cpulist", "read_node_topology", "with_sysfs_places"]
