"""The plan: moldable widths and longest-first order, never predicted worse than the packer without a plan."""

from __future__ import annotations

import heapq
import random

import pytest

from musubi.fleet.durations import seconds_on
from musubi.fleet.moldable import best_plan, lower_bound, makespan, simulate
from musubi.fleet.packer import Demand, Packer, order


def job(rng: random.Random, i: int, capacity: int) -> Demand:
    """A random job: one-GPU-only (an external command), fixed multi-GPU, or moldable 1..capacity."""
    one = rng.uniform(20, 600)
    startup, comm = rng.uniform(5, 30), rng.uniform(0, 0.4)
    kind = rng.choice(["single", "fixed", "moldable", "moldable"])
    prio = rng.choice([0, 0, 0, 1, 2])
    if kind == "single":
        return Demand(f"j{i}", 1, prio, seconds=(startup + one,))
    if kind == "fixed":
        g = rng.randint(1, capacity)
        return Demand(f"j{i}", g, prio, seconds=(seconds_on(g, one, startup, comm, True),))
    widths = tuple(range(1, capacity + 1))
    return Demand(f"j{i}", rng.randint(1, capacity), prio, widths=widths,
                  seconds=tuple(seconds_on(w, one, startup, comm, True) for w in widths))


def run_online(gpus: int, queue: list[Demand]) -> list[tuple[str, tuple[int, ...], float, float]]:
    """The fleet's loop on a virtual clock (as --dry-run drives it): re-plans after every end; checks invariants."""
    clock = [0.0]
    p = Packer(list(range(gpus)), list(queue), planner=best_plan, clock=lambda: clock[0])
    ends: list[tuple[float, str]] = []
    out = []
    while p.queue or ends:
        for d, g in p.place():
            t = d.predicted(len(g))
            assert t is not None, f"{d.name} got {len(g)} GPUs, not one of its widths {d.allowed()}"
            heapq.heappush(ends, (clock[0] + t, d.name))
            out.append((d.name, tuple(g), clock[0], clock[0] + t))
        in_use = [x for gs in p.busy.values() for x in gs]
        assert len(in_use) == len(set(in_use)), "a GPU was given to two jobs"
        assert set(in_use) | set(p.free) == set(range(gpus))
        if not ends:
            break
        clock[0], name = heapq.heappop(ends)
        finished = [name]
        while ends and ends[0][0] <= clock[0]:
            finished.append(heapq.heappop(ends)[1])
        for n in finished:
            p.release(n)
            p.done.add(n)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_random_fleets_plan_never_worse_than_the_declared_packer(seed: int) -> None:
    rng = random.Random(seed)
    gpus = rng.choice([2, 4, 8])
    queue = [job(rng, i, gpus) for i in range(rng.randint(1, 14))]
    declared = makespan(simulate(list(range(gpus)), order(list(queue)), {d.name: d.gpus for d in queue}))
    plan = best_plan(list(range(gpus)), queue)
    assert plan.makespan <= declared + 1e-6
    assert plan.declared == pytest.approx(declared)
    assert plan.makespan >= lower_bound(queue, gpus) - 1e-6
    ran = run_online(gpus, queue)
    assert sorted(r[0] for r in ran) == sorted(d.name for d in queue), "a job was starved"
    # the online loop re-plans at every end and keeps the previous plan as a candidate: no worse than its start
    assert max(r[3] for r in ran) <= plan.makespan + 1e-6
    by_name = {d.name: d for d in queue}
    for name, g, _, _ in ran:
        assert len(g) in by_name[name].allowed()
        if not by_name[name].widths:
            assert len(g) == by_name[name].gpus, f"{name} is not moldable but got {len(g)} GPUs"
    at = {r[0]: r[2] for r in ran}
    late = [(h, lo) for h in at for lo in at if by_name[h].priority > by_name[lo].priority and at[h] > at[lo]]
    assert not late, f"higher-priority jobs started after lower-priority ones: {late}"


def test_the_issue_fleet_longest_single_gpu_job_no_longer_runs_alone_at_the_end() -> None:
    """4 GPUs, the measured shape of issue 19: the longest one-GPU job started last and ran alone."""
    def mold(name: str, gpus: int, one: float) -> Demand:
        ws = (1, 2, 3, 4)
        return Demand(name, gpus, widths=ws, seconds=tuple(seconds_on(w, one, 25, 0.05, True) for w in ws))

    queue = [mold("resnet50", 2, 150), Demand("resnet18", 1, seconds=(85.0,)), mold("fcos", 2, 140),
             mold("gpt", 2, 120), Demand("ext-a", 1, seconds=(70.0,)), Demand("ext-b", 1, seconds=(60.0,))]
    declared = makespan(simulate([0, 1, 2, 3], order(queue), {d.name: d.gpus for d in queue}))
    plan = best_plan([0, 1, 2, 3], queue)
    assert plan.makespan < 0.85 * declared
    start = {b.name: b.start for b in plan.bars}
    assert start["resnet18"] == 0.0  # the longest rigid job goes first (LPT)


def test_widening_only_where_it_shortens_the_tail() -> None:
    """More jobs than GPUs and perfect scaling: side by side on one GPU each beats widening anything."""
    ws = (1, 2)
    queue = [Demand(f"j{i}", 1, widths=ws, seconds=(100.0, 60.0)) for i in range(4)]
    plan = best_plan([0, 1], queue)
    assert set(plan.widths.values()) == {1} and plan.makespan == pytest.approx(200.0)
    # one job alone: widen it
    solo = best_plan([0, 1], queue[:1])
    assert solo.widths == {"j0": 2} and solo.makespan == pytest.approx(60.0)


def test_without_predictions_the_packer_is_unchanged() -> None:
    jobs = [Demand("big", 3), Demand("a", 1), Demand("b", 1)]
    p = Packer([0, 1, 2, 3], list(jobs), planner=best_plan)
    assert not p.planning()
    assert [(d.name, g) for d, g in p.place()] == [("big", [0, 1, 2]), ("a", [3])]
