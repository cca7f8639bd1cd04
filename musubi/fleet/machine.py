"""What the fleet knows of its machine: the topology it places jobs by, and each device's own cores."""

from __future__ import annotations

import logging
from pathlib import Path

from musubi.config.fleet import FleetSpec
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.topology.cores import CorePlan, partition_cores, read_cpus
from musubi.topology.model import NodeTopology, format_cpulist
from musubi.topology.read import env_topology, load_topology, numa_nodes, read_node_topology

log = logging.getLogger("musubi.fleet")

#: The variable that hands each local rank its cores: one cpulist per local rank, ';'-separated ("0-7;8-15").
#: `extra=` of the fleet's log records that `musubi run` also prints on the console (placement, pinning).
SHOW = {"show": True}


def fleet_topology(spec: FleetSpec, base: Path, run_dir: Path, kind: str) -> NodeTopology | None:
    """The recorded topology the fleet names, else this machine's (from env.json when it holds one); None on CPU."""
    if spec.machine.topology:
        return recorded_topology(spec, base)
    if kind != "cuda":
        return None
    return env_topology(run_dir / RUN_FILES.env) or read_node_topology()


def recorded_topology(spec: FleetSpec, base: Path) -> NodeTopology:
    """The topology file `machine.topology` names (relative to the fleet file), or a one-line ConfigError."""
    assert spec.machine.topology
    path = Path(spec.machine.topology)
    try:
        return load_topology(path if path.is_absolute() else base / path)
    except ConfigError as e:
        raise ConfigError(f"machine.topology: {e}") from None


def check_topology(spec: FleetSpec, base: Path, devices: list[int]) -> NodeTopology | None:
    """Before anything is written: the recorded topology `machine.topology` names loads, and it covers every
    device of this fleet (its GPU indices, or the CPU slots standing for them). None without machine.topology."""
    if not spec.machine.topology:
        return None
    topo = recorded_topology(spec, base)
    missing = [d for d in devices if d not in topo.gpu_indices]
    if missing:
        have = ",".join(map(str, topo.gpu_indices))
        raise ConfigError(f"machine.topology {spec.machine.topology}: it has GPUs {have}, but this fleet runs on "
                          f"{','.join(map(str, devices))} ({','.join(map(str, missing))} not in it); record "
                          "`nvidia-smi topo -m` on this machine, or drop machine.topology to read it live")
    return topo


def device_unit(kind: str) -> str:
    """What one of the fleet's devices is called: a GPU, or a CPU slot (the place of one CPU rank)."""
    return "GPU" if kind == "cuda" else "CPU slot"


def cores_text(cpulist: str) -> str:
    """'0' -> 'core 0', '0-7' -> 'cores 0-7': a core list said as one (a bare '0' reads as a count)."""
    return f"core {cpulist}" if cpulist.isdigit() else f"cores {cpulist}"


def describe_cpus(value: str) -> str:
    """A MUSUBI_CPUS value in words: '0;1' -> 'rank 0 on core 0, rank 1 on core 1'."""
    return ", ".join(f"rank {r} on {cores_text(c)}" for r, c in enumerate(value.split(";")))


def device_cores(devices: list[int], topo: NodeTopology | None, kind: str = "cuda") -> CorePlan:
    """Each device's own cores on this machine (NUMA nodes from the topology when it knows them)."""
    numa = numa_nodes(topo) if topo is not None else {}
    # Nodes with GPUs this fleet was not given keep their cores (another job may run there).
    reserved = frozenset(n for g, n in numa.items() if g not in devices)
    plan = partition_cores(devices, numa, read_cpus(), reserved)
    if plan:
        unit = device_unit(kind)
        log.info("cores per %s (%s): %s", unit, plan.reason,
                 "; ".join(f"{unit} {d}: {cores_text(format_cpulist(c))}" for d, c in sorted(plan.sets.items())),
                 extra=SHOW)
    else:
        log.info("no CPU pinning: %s", plan.reason, extra=SHOW)
    return plan


def cpus_value(plan: CorePlan, devices: list[int]) -> str | None:
    """MUSUBI_CPUS for a job on `devices` (local rank order), or None without a plan."""
    if not plan or any(d not in plan.sets for d in devices):
        return None
    return ";".join(format_cpulist(plan.sets[d]) for d in devices)
