"""Core partitions: every device gets its own cores, from its NUMA node, never one shared (properties + sysfs)."""

from __future__ import annotations

from pathlib import Path

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
            assert {ids[c].numa for c in s} == {numa_of[d]}, "cores from another NUMA node"
    # no core of a used NUMA node (or, flat, of the machine) is left idle
    used_nodes = {numa_of[d] for d in devices} if plan.mode == "numa" else None
    assert seen == {c.id for c in cpus if used_nodes is None or c.numa in used_nodes}


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
