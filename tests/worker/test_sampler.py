"""Sampler partitions: disjoint, covering, resumable; validation without padding."""

from __future__ import annotations

import pytest

from musubi.worker.feed.sampler import ResumableDistributedSampler, ShardedEvalSampler


@pytest.mark.parametrize("n,world", [(100, 2), (103, 4), (7, 3)])
def test_train_partitions_are_disjoint_and_cover(n: int, world: int) -> None:
    data = list(range(n))
    parts = []
    for r in range(world):
        s = ResumableDistributedSampler(data, world, r, seed=5)
        s.set_epoch(2)
        parts.append(list(s))
    flat = [i for p in parts for i in p]
    assert len(flat) == len(set(flat)) == (n // world) * world  # drop_last: no padded duplicates
    assert len({len(p) for p in parts}) == 1


def test_epochs_reshuffle_and_resume_skips_exactly() -> None:
    data = list(range(64))
    s = ResumableDistributedSampler(data, 2, 1, seed=0)
    s.set_epoch(0)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert e0 != e1 and sorted(e0) != sorted(range(32))
    s.set_position(1, 10)
    assert list(s) == e1[10:]
    assert list(s) == e1  # the skip applies to one pass only


@pytest.mark.parametrize("n,world", [(31, 2), (5, 4), (3, 4), (0, 2)])
def test_eval_shards_count_every_sample_once(n: int, world: int) -> None:
    parts = [list(ShardedEvalSampler(n, world, r)) for r in range(world)]
    flat = sorted(i for p in parts for i in p)
    assert flat == list(range(n))
