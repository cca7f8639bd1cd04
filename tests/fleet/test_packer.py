"""Packer placement: no GPU over-committed, single-GPU jobs fill gaps, priorities respected."""

from __future__ import annotations

import random

import pytest

from musubi.fleet.packer import Demand, Packer, order, unplaceable


def simulate(jobs: list[Demand], gpus: int, durations: dict[str, float]) -> list[tuple[float, str, list[int]]]:
    """Event simulation of the packer; returns (start time, job, GPUs) and checks invariants on the way."""
    p = Packer(list(range(gpus)), list(jobs))
    t, running, starts = 0.0, {}, []
    while p.queue or running:
        for d, g in p.place():
            starts.append((t, d.name, g))
            running[d.name] = t + durations[d.name]
        in_use = [x for gs in p.busy.values() for x in gs]
        assert len(in_use) == len(set(in_use)), "a GPU was given to two jobs"
        assert set(in_use) | set(p.free) == set(range(gpus)) and not set(in_use) & set(p.free)
        # no GPU idles while a queued job would fit, unless a higher-priority job waits for GPUs (reserved)
        top = max((d.priority for d in p.queue if d.gpus > len(p.free)), default=None)
        assert not any(d.gpus <= len(p.free) and (top is None or d.priority >= top) for d in p.queue)
        name = min(running, key=running.get)
        t = running.pop(name)
        p.release(name)
    return starts


@pytest.mark.parametrize("seed", range(30))
def test_random_fleets_never_overcommit_and_never_idle(seed: int) -> None:
    rng = random.Random(seed)
    gpus = rng.choice([1, 2, 4, 8])
    jobs = [Demand(f"j{i}", rng.choice([1, 1, 1, 2, 4, 8]) if gpus >= 8 else rng.randint(1, gpus),
                   rng.randint(-2, 2), rng.choice([None, "a", "b"])) for i in range(rng.randint(1, 15))]
    durations = {j.name: rng.uniform(1, 10) for j in jobs}
    starts = simulate(jobs, gpus, durations)
    assert sorted(s[1] for s in starts) == sorted(j.name for j in jobs)
    # priorities respected under backfill: no job starts after a lower-priority one
    at = {name: t for t, name, _ in starts}
    prio = {j.name: j.priority for j in jobs}
    late = [(h, lo) for h in at for lo in at if prio[h] > prio[lo] and at[h] > at[lo]]
    assert not late, f"higher-priority jobs started after lower-priority ones: {late}"


def test_high_priority_multi_gpu_job_is_not_starved_by_small_backfill() -> None:
    """The review's case: 4 GPUs busy with 1-GPU jobs, more queued, then a 4-GPU priority-10 job arrives."""
    p = Packer([0, 1, 2, 3], [Demand(f"lo{i}", 1) for i in range(12)])
    first = [d.name for d, _ in p.place()]
    assert len(first) == 4
    p.requeue(Demand("HI-ddp", 4, priority=10))  # a retry, or a job whose `after:` just cleared
    started = []
    for name in first:  # the running small jobs end one by one: their GPUs are kept for HI-ddp
        p.release(name)
        started += [d.name for d, _ in p.place()]
    assert started == ["HI-ddp"]
    p.release("HI-ddp")
    assert len(p.place()) == 4  # then the small ones fill the machine again


def test_single_gpu_jobs_fill_the_gaps_beside_a_distributed_job() -> None:
    jobs = [Demand("big", 3), Demand("a", 1), Demand("b", 1)]
    starts = simulate(jobs, 4, {"big": 10, "a": 4, "b": 4})
    at0 = {name: g for t, name, g in starts if t == 0}
    assert at0["big"] == [0, 1, 2] and at0["a"] == [3]  # the fourth GPU does not idle
    assert [name for t, name, g in starts if t > 0] == ["b"]


def test_order_previous_best_priority_family_then_size() -> None:
    jobs = [Demand("s1", 1), Demand("big", 4), Demand("hi", 1, priority=5), Demand("best", 1, first=True),
            Demand("f1", 1, family="yolo"), Demand("x", 2, family="detr"), Demand("f2", 1, family="yolo")]
    names = [d.name for d in order(jobs)]
    assert names[:2] == ["best", "hi"]
    assert abs(names.index("f1") - names.index("f2")) == 1  # a family runs back to back
    assert names.index("big") < names.index("s1")  # larger demand first within a level


def test_job_larger_than_the_machine_is_refused() -> None:
    assert "asks for 8 GPUs but this machine has 4" in unplaceable([Demand("huge", 8)], 4)[0]
