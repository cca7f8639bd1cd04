"""Core partitions: every device gets its own cores, from its NUMA node, never one shared (properties + sysfs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musubi.topology.cores import Cpu, partition_cores, read_cpus
from musubi.topology.read import numa_nodes

from .recorded import PCIE8, recorded


def machine(nodes: int, cores_per_node: int, threads: int = 2) -> list[Cpu]:
    """Linux numbering: all first hyperthreads, then their siblings (cpu c and c + total are one core)."""
    total = nodes * cores_per_node
    return [Cpu(t * total + c, c // cores_per_node, (c // cores_per_node, c % cores_per_node))
            for t in range(threads) for c in range(total)]


def test_two_sockets_eight_gpus_whole_cores_from_their_node() -> None:
    cpus = machine(2, 16)  # like the PCIe fixture: 0-15,32-47 on node 0
    plan = partition_cores(list(range(8)), numa_nodes(recorded(PCIE8)), cpus)
    assert plan.mode == "numa"
    assert plan.sets[0] == (0, 1, 2, 3, 32, 33, 34, 35)  # 4 physical cores with their siblings
    assert plan.sets[7] == (28, 29, 30, 31, 60, 61, 62, 63)


def test_unknown_numa_splits_everything_and_too_few_cpus_is_no_plan() -> None:
    plan = partition_cores([0, 1, 2], {0: 0, 1: None, 2: 1}, machine(2, 2, threads=1))
    assert plan.mode == "flat" and sorted(len(s) for s in plan.sets.values()) == [1, 1, 2]
    none = partition_cores([0, 1, 2], {}, machine(1, 2, threads=1))
    assert not none and "fewer than one each" in none.reason


@settings(max_examples=150, deadline=None)
@given(nodes=st.integers(1, 4), cores=st.integers(1, 12), threads=st.integers(1, 2),
       devices=st.lists(st.integers(0, 15), min_size=1, max_size=16, unique=True),
       numa=st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=16, max_size=16),
       allowed=st.sets(st.integers(0, 95), min_size=1))
def test_partitions_never_overlap_and_respect_numa(nodes, cores, threads, devices, numa, allowed) -> None:
    cpus = [c for c in machine(nodes, cores, threads) if c.id in allowed] or machine(nodes, cores, threads)
    numa_of = {d: numa[d] for d in devices}
    plan = partition_cores(devices, numa_of, cpus)
    if not plan:
        assert plan.reason
        return
    assert sorted(plan.sets) == sorted(devices)
    seen: set[int] = set()
    ids = {c.id: c for c in cpus}
    for d, s in plan.sets.items():
        assert s and not seen & set(s), "a core given to two devices"
        seen |= set(s)
        assert set(s) <= set(ids)
        if plan.mode == "numa":
            homes = {numa_of[x] for x in devices}
            # its own node's cores, plus maybe some of nodes without any device; never another device's node
            assert {ids[c].numa for c in s} - {numa_of[d]} <= {c.numa for c in cpus} - homes, "another's node"
            assert any(ids[c].numa == numa_of[d] for c in s)
    # no core is left idle (GPU-less NUMA nodes are shared out too), unless too few to go round
    spare = [c for c in cpus if plan.mode == "numa" and c.numa not in {numa_of[d] for d in devices}]
    if len(spare) >= len(devices) or not spare:
        assert seen == {c.id for c in cpus}


def test_read_cpus_from_sysfs(tmp_path: Path) -> None:
    cpu, node = tmp_path / "cpu", tmp_path / "node"
    for c in range(4):
        topo = cpu / f"cpu{c}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{c % 2}\n")
    (node / "node0").mkdir(parents=True)
    (node / "node0" / "cpulist").write_text("0-3\n")
    got = [c for c in read_cpus(cpu, node) if c.id < 4]
    assert all(c.numa == 0 for c in got) and {c.core for c in got} <= {(0, 0), (0, 1)}


def test_numa_nodes_without_gpus_are_shared_out_and_the_reason_names_the_devices_nodes() -> None:
    cpus = machine(2, 16)  # 64 CPUs; all 4 GPUs on node 0
    plan = partition_cores([0, 1, 2, 3], {0: 0, 1: 0, 2: 0, 3: 0}, cpus)
    assert plan.mode == "numa"
    assert plan.sets[0] == (0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51)  # node 0 share + node 1
    assert sum(len(s) for s in plan.sets.values()) == 64  # before: node 1's 32 CPUs went to no rank
    assert "4 devices on NUMA node(s) 0" in plan.reason and "NUMA node(s) 1 (no device there)" in plan.reason
    assert "CPU ranks" in partition_cores([0, 1], {}, cpus).reason  # not "devices without a known NUMA node"


def test_nodes_with_gpus_of_other_jobs_are_never_shared_out() -> None:
    cpus = machine(2, 16)
    plan = partition_cores([0, 1], {0: 0, 1: 0}, cpus, reserved=frozenset({1}))  # GPUs 4-7 (node 1) not ours
    assert all(c < 16 or 32 <= c < 48 for s in plan.sets.values() for c in s)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="affinity masks are Linux's")
def test_thread_counts_follow_the_affinity_not_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside an allocation (Slurm, a cpuset, a test worker's slice) the ranks' threads are sized for the cores
    the process may use, not for every core of the machine."""
    from musubi.launch.launch import worker_env
    from musubi.topology.cores import usable_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert usable_cores() == 1
        assert worker_env("cpu", 1, False)["OMP_NUM_THREADS"] == "1"
    finally:
        os.sched_setaffinity(0, before)
    assert usable_cores() == len(before)
