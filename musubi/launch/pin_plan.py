"""Launcher side of rank pinning: which cores each local rank gets (MUSUBI_CPUS), and torchrun's NUMA flag.

A fleet hands its jobs MUSUBI_CPUS (the cores of their GPUs, see fleet/machine.py);
a lone `musubi train` computes it here the same way: the machine's cores split
between all of its GPUs, each rank taking its own GPU's share, so two jobs on
one machine never share a core. When a scheduler already gave the job a cpuset
of its own (its affinity is narrower than the machine), the cores are split
between the job's own GPUs only. The ranks apply it (worker/pinning.py).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass, field

from musubi.contract.env import MUSUBI_CPUS
from musubi.contract.errors import ConfigError
from musubi.topology.cores import partition_cores, read_cpus
from musubi.topology.model import NodeTopology, format_cpulist, parse_cpulist

log = logging.getLogger("musubi.launch")



@dataclass
class PinPlan:
    """What the launcher adds for pinning: environment, torchrun arguments, and a line for the log."""

    env: dict[str, str] = field(default_factory=dict)
    torchrun_args: list[str] = field(default_factory=list)
    note: str = ""
    drop: bool = False  # remove an inherited MUSUBI_CPUS (pinning off)


def rank_gpus(nproc: int, visible: str | None) -> list[int] | None:
    """nvidia-smi indices of local ranks 0..nproc-1 (CUDA_VISIBLE_DEVICES order); None when it names UUIDs."""
    if visible is None:
        return list(range(nproc))
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not all(e.isdigit() for e in entries):
        return None
    return [int(e) for e in entries[:nproc]]


def check_cpus_value(value: str, nproc: int) -> None:
    """Refuse a MUSUBI_CPUS that gives fewer core sets than ranks, an empty set, or a core to two ranks."""
    parts = value.split(";")
    sets = [parse_cpulist(p) for p in parts]
    if len(sets) < nproc or any(not s for s in sets[:nproc]):
        raise ConfigError(f"{MUSUBI_CPUS}={value!r} gives {len([s for s in sets if s])} core set(s) for {nproc} ranks; "
                          f"give one non-empty cpulist per rank, ';'-separated (e.g. '0-7;8-15'), or unset it")
    seen: set[int] = set()
    for s in sets[:nproc]:
        if seen & set(s):
            raise ConfigError(f"{MUSUBI_CPUS}={value!r} gives core {min(seen & set(s))} to two ranks; give each rank "
                              "its own cores, or unset it")
        seen |= set(s)


def numa_binding_supported() -> bool:
    """torchrun has --numa-binding (torch >= 2.9) and numactl, which it needs, is installed."""
    try:
        found = importlib.util.find_spec("torch.numa.binding") is not None
    except ModuleNotFoundError:
        found = False
    return found and shutil.which("numactl") is not None


def plan_pinning(enabled: bool, kind: str, nproc: int, env: dict[str, str],
                 topology: NodeTopology | None = None) -> PinPlan:
    """MUSUBI_CPUS for this job's ranks (kept if a fleet or the user gave it), and torchrun's NUMA binding."""
    if not enabled:
        return PinPlan(drop=True, note="CPU pinning off (train.pin_cpus: false)")
    given = env.get(MUSUBI_CPUS)
    if given:
        check_cpus_value(given, nproc)
        return PinPlan(note=f"cores per rank from {MUSUBI_CPUS}: {given}")
    if kind == "cuda":
        gpus = rank_gpus(nproc, env.get("CUDA_VISIBLE_DEVICES"))
        if gpus is None:
            return PinPlan(note="no CPU pinning: CUDA_VISIBLE_DEVICES names GPUs by UUID")
        if topology is None:
            from musubi.topology.read import read_node_topology

            topology = read_node_topology()
        numa = {g.index: g.numa for g in topology.gpus}
        if narrowed():
            # A scheduler (Slurm, a container) gave this job its own cpuset: the cores it may use are its own
            # already, so they are split between its own GPUs only.
            devices, scope = sorted(set(gpus)), "this job's GPUs (its cpuset is its own)"
        else:
            # Split over every GPU of the machine, so that a job beside this one gets other cores.
            devices = sorted(set(topology.gpu_indices) | set(gpus))
            scope = f"all {len(devices)} GPUs of the machine" if len(devices) > len(gpus) else "its GPUs"
    else:
        gpus = list(range(nproc))
        devices, numa, scope = gpus, {}, "its CPU ranks"
    cpus = read_cpus()
    plan = partition_cores(devices, numa, cpus)
    if not plan:
        return PinPlan(note=f"no CPU pinning: {plan.reason}")
    value = ";".join(format_cpulist(plan.sets[g]) for g in gpus)
    used = sum(len(plan.sets[g]) for g in gpus)
    if used * 4 < len(cpus) * 3:
        log.warning("CPU pinning gives this job's %d rank(s) %d of the %d CPUs it may use (cores split over %s, "
                    "so a job beside it gets other cores); if it runs alone and its data loading is CPU-bound, "
                    "set train.pin_cpus: false, or run it under a scheduler that gives it a cpuset", len(gpus),
                    used, len(cpus), scope)
    args: list[str] = []
    if kind == "cuda" and plan.mode == "numa" and numa_binding_supported():
        # torchrun binds each worker to its GPU's NUMA node from its first instruction; the rank then
        # narrows to its own cores within that node.
        args = ["--numa-binding=node"]
    return PinPlan(env={MUSUBI_CPUS: value}, torchrun_args=args,
                   note=f"cores per rank (split over {scope}; {plan.reason}): {value}")


def narrowed() -> bool:
    """This process may use fewer CPUs than the machine has online (a cgroup cpuset or an affinity mask)."""
    try:
        return len(os.sched_getaffinity(0)) < (os.cpu_count() or 0)
    except (AttributeError, OSError):
        return False


def apply_to_env(plan: PinPlan, env: dict[str, str]) -> dict[str, str]:
    """The workers' environment with the plan applied."""
    out = dict(env)
    if plan.drop:
        out.pop(MUSUBI_CPUS, None)
    out.update(plan.env)
    if os.environ.get("OMP_NUM_THREADS") is None and MUSUBI_CPUS in out:
        # Threads per rank follow its cores (the rank refines it with torch.set_num_threads).
        out["OMP_NUM_THREADS"] = str(min(len(parse_cpulist(p)) for p in out[MUSUBI_CPUS].split(";")))
    return out
