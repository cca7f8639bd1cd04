"""CPU cores of this machine and their split between devices: each GPU (or CPU rank slot) gets its own cores.

The split is made per device of the machine, not per job: a rank of any job
runs on the cores of its GPU, so jobs sharing a machine never share a core as
long as they never share a GPU (which the packer guarantees). Cores of the
GPU's own NUMA node are split evenly between the GPUs of that node, whole
physical cores (hyperthread siblings stay together) before logical CPUs.
Without NUMA information (a VM, CPU rank slots) all allowed cores are split
evenly. Cores of NUMA nodes without GPUs are split between all devices too (after
each device's own node's share), so they do not idle.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from musubi.topology.model import parse_cpulist

SYSFS_CPU = Path("/sys/devices/system/cpu")
SYSFS_NODE = Path("/sys/devices/system/node")


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask (a Slurm allocation, a container's cpuset, a test
    worker's slice), else the machine's count. Never os.cpu_count() alone: inside an allocation of 8 of 64 cores
    that would size every rank's threads for the whole machine."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Cpu:
    """One logical CPU this process may run on."""

    id: int
    numa: int | None = None
    core: tuple[int, int] | None = None  # (package, core id): hyperthread siblings share it


@dataclass(frozen=True)
class CorePlan:
    """Each device's own cores (no two devices share one), or why there is no plan."""

    sets: dict[int, tuple[int, ...]] = field(default_factory=dict)
    mode: str = "none"  # 'numa' | 'flat' | 'none'
    reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.sets)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def read_cpus(sysfs_cpu: Path = SYSFS_CPU, sysfs_node: Path = SYSFS_NODE) -> list[Cpu]:
    """The CPUs this process may use (its affinity mask: cgroups and containers applied), with NUMA node and core."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        allowed = list(range(os.cpu_count() or 1))
    node_of: dict[int, int] = {}
    for node in sorted(sysfs_node.glob("node[0-9]*")):
        try:
            cpus = parse_cpulist((node / "cpulist").read_text())
        except OSError:
            continue
        for c in cpus:
            node_of[c] = int(node.name.removeprefix("node"))
    out = []
    for c in allowed:
        topo = sysfs_cpu / f"cpu{c}" / "topology"
        pkg, core = _read_int(topo / "physical_package_id"), _read_int(topo / "core_id")
        out.append(Cpu(c, node_of.get(c), (pkg, core) if pkg is not None and core is not None else None))
    return out


def _chunks(items: list, n: int) -> list[list]:
    """`items` cut into n contiguous chunks whose sizes differ by at most one (the first ones larger)."""
    q, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        size = q + (1 if i < r else 0)
        out.append(items[start:start + size])
        start += size
    return out


def _split(cpus: list[Cpu], devices: list[int]) -> dict[int, tuple[int, ...]] | None:
    """Split `cpus` between `devices`: whole physical cores if there are enough, else logical CPUs."""
    cores: dict[tuple[int, int] | int, list[int]] = {}
    for c in sorted(cpus, key=lambda c: c.id):
        cores.setdefault(c.core if c.core is not None else c.id, []).append(c.id)
    groups = sorted(cores.values(), key=min)
    if len(groups) < len(devices):
        groups = [[c.id] for c in sorted(cpus, key=lambda c: c.id)]
    if len(groups) < len(devices):
        return None
    return {d: tuple(sorted(x for g in chunk for x in g)) for d, chunk in zip(devices, _chunks(groups, len(devices)),
                                                                           strict=True)}


def partition_cores(devices: list[int], numa_of: dict[int, int | None], cpus: list[Cpu],
                    reserved: frozenset[int | None] = frozenset()) -> CorePlan:
    """Each device's own cores: from its NUMA node when every device's node is known (plus a share of the cores
    of NUMA nodes without any device), else from all cores. `reserved`: NUMA nodes never shared out (they hold
    GPUs of the machine that are not among `devices`, which other jobs may use)."""
    devices = sorted(set(devices))
    if not devices or not cpus:
        return CorePlan(reason="no devices" if not devices else "no CPUs readable")
    nodes = {c.numa for c in cpus if c.numa is not None}
    if all(numa_of.get(d) in nodes for d in devices) and nodes:
        sets: dict[int, tuple[int, ...]] = {}
        homes = sorted({numa_of[d] for d in devices})  # type: ignore[type-var]
        for node in homes:
            here = [d for d in devices if numa_of.get(d) == node]
            part = _split([c for c in cpus if c.numa == node], here)
            if part is None:
                return CorePlan(reason=f"NUMA node {node} has fewer CPUs than its {len(here)} devices")
            sets.update(part)
        why = f"{len(devices)} devices on NUMA node(s) {','.join(map(str, homes))}"
        # NUMA nodes without a device (or CPUs of unknown node): their cores would idle; split them too, so a
        # rank's loader workers may use them. Still no core for two devices.
        rest = [c for c in cpus if c.numa not in homes and c.numa not in reserved]
        spill = _split(rest, devices) if rest else None
        if spill:
            sets = {d: tuple(sorted(sets[d] + spill[d])) for d in devices}
            others = sorted({c.numa for c in rest if c.numa is not None})
            why += (f", plus the {len(rest)} CPUs of NUMA node(s) {','.join(map(str, others)) or '?'} (no device "
                    "there) shared out")
        return CorePlan(sets, "numa", why)
    part = _split(cpus, devices)
    if part is None:
        return CorePlan(reason=f"{len(cpus)} CPUs for {len(devices)} devices: fewer than one each")
    if not numa_of:
        why = "CPU ranks (no NUMA node of their own)"
    else:
        why = "devices without a known NUMA node" if nodes else "no NUMA information"
    return CorePlan(part, "flat", f"{why}: {len(cpus)} CPUs split evenly")
