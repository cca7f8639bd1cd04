"""Topology-aware placement on recorded topologies: optimal by the link-cost model (brute force), and never
over-committed (property test of the packer)."""

from __future__ import annotations

import random
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musubi.fleet.packer import Demand, Packer
from musubi.fleet.placement import choose
from musubi.topology.model import link_cost

from ..topology.recorded import ALL, NVLINK4, NVSWITCH8, PAIRS8, PCIE8, recorded


def brute_cost(topo, group) -> tuple[float, float]:
    """(bottleneck, sum) of pairwise link costs, computed here independently of the placement module."""
    costs = [link_cost(topo.link(a, b)) for a, b in combinations(group, 2)] or [0.0]
    return (max(costs), sum(costs))


@pytest.mark.parametrize("name", ALL)
def test_every_choice_is_optimal_by_brute_force(name: str) -> None:
    topo = recorded(name)
    n = len(topo.gpu_indices)
    rng = random.Random(name)
    for _ in range(40):
        free = sorted(rng.sample(range(n), rng.randint(1, n)))
        k = rng.randint(1, len(free))
        got = choose(topo, free, k).gpus
        assert set(got) <= set(free) and len(set(got)) == k
        best = min(brute_cost(topo, g) for g in combinations(free, k))
        assert brute_cost(topo, got) == pytest.approx(best), (free, k, got)


def test_pcie_pair_stays_on_one_switch_and_leaves_a_whole_switch() -> None:
    topo = recorded(PCIE8)
    # GPU 5 is busy: a 2-GPU job should use 6,7 (PIX) and leave 0-3 whole for the queued 4-GPU job
    c = choose(topo, [0, 1, 2, 3, 4, 6, 7], 2, [("big", 4)])
    assert c.gpus == (6, 7) and "PIX" in c.reason and "leaves 0,1,2,3" in c.reason
    assert choose(topo, list(range(8)), 4).gpus in {(0, 1, 2, 3), (4, 5, 6, 7)}  # never across the sockets


def test_single_gpu_job_takes_the_gpu_least_useful_to_the_queue() -> None:
    pairs = recorded(PAIRS8)
    # 0 is busy: its NVLink partner 1 is the orphan; taking 2 would break the 2-3 pair
    assert choose(pairs, [1, 2, 3, 4, 5, 6, 7], 1, [("p", 2), ("q", 2), ("r", 2)]).gpus == (1,)
    # with no multi-GPU job queued, still the GPU least linked to the rest
    assert choose(pairs, [1, 2, 3], 1).gpus == (1,)
    assert choose(recorded(NVLINK4), [0, 1, 2, 3], 2).gpus == (0, 1)  # all equal: lowest indices


def test_without_topology_lowest_free_gpus() -> None:
    assert choose(None, [3, 1, 5], 2).gpus == (1, 3)


def test_packer_places_by_topology_and_says_why() -> None:
    p = Packer(list(range(8)), [Demand("solo", 1, priority=5), Demand("duo", 2), Demand("quad", 4)],
               topology=recorded(PAIRS8))
    placed = {d.name: g for d, g in p.place()}
    assert placed["quad"] in ([0, 1, 2, 3], [4, 5, 6, 7])
    duo = placed["duo"]
    assert pairs_of(duo) and p.reasons["duo"].startswith("best-linked 2 of free")
    assert placed["solo"][0] not in duo


def pairs_of(g: list[int]) -> bool:
    return len(g) == 2 and g[0] // 2 == g[1] // 2


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(ALL), seed=st.integers(0, 10_000),
       demands=st.lists(st.tuples(st.integers(1, 8), st.integers(-1, 1)), min_size=1, max_size=10))
def test_packer_with_topology_never_overcommits(name: str, seed: int, demands: list[tuple[int, int]]) -> None:
    topo = recorded(name)
    n = len(topo.gpu_indices)
    rng = random.Random(seed)
    jobs = [Demand(f"j{i}", min(g, n), prio) for i, (g, prio) in enumerate(demands)]
    p = Packer(list(range(n)), list(jobs), topology=topo)
    running: list[str] = []
    started = 0
    while p.queue or running:
        for d, g in p.place():
            assert len(g) == d.gpus and len(set(g)) == d.gpus
            running.append(d.name)
            started += 1
        held = [x for gs in p.busy.values() for x in gs]
        assert len(held) == len(set(held)), "a GPU given to two jobs"
        assert set(held).isdisjoint(p.free) and set(held) | set(p.free) == set(range(n))
        top = max((d.priority for d in p.queue if d.gpus > len(p.free)), default=None)  # reserved for it
        assert not any(d.gpus <= len(p.free) and (top is None or d.priority >= top) for d in p.queue), \
            "a GPU idles while a queued job fits"
        p.release(running.pop(rng.randrange(len(running))))
    assert started == len(jobs)


def test_nvswitch_any_group_is_as_good() -> None:
    assert choose(recorded(NVSWITCH8), [2, 5, 7], 2).gpus == (2, 5)
