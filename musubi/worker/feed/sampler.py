"""Samplers: a resumable training partition and an unpadded validation partition."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler that can start an epoch part-way (exact resume of the data order).

    `set_position(epoch, start)` makes the next iteration yield this rank's
    indices of `epoch` from position `start` on; the permutation is the same as
    DistributedSampler's (seeded by seed + epoch), so a resumed run sees exactly
    the samples an uninterrupted run would have seen.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_position(self, epoch: int, start: int) -> None:
        """Next `__iter__` yields epoch `epoch`'s indices from `start` (in samples of this rank)."""
        self.set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        groups = getattr(self.dataset, "frame_groups", None)
        indices = self._grouped(groups) if groups else list(super().__iter__())
        start, self.start = self.start, 0  # the skip applies to one epoch only
        return iter(indices[start:])

    def _grouped(self, groups: list[list[int]]) -> list[int]:
        """Frame-grouped order (a sliced set without its tile cache): frames shuffled, each frame's tiles
        shuffled and kept together, ranks taking contiguous runs, so consecutive samples (one batch, one
        worker) share a decoded frame. Seeded by seed + epoch like the plain order (exact resume)."""
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        flat: list[int] = []
        for f in torch.randperm(len(groups), generator=g).tolist():
            tiles = groups[f]
            flat += [tiles[i] for i in torch.randperm(len(tiles), generator=g).tolist()]
        return flat[self.rank * self.num_samples : (self.rank + 1) * self.num_samples]


class ShardedEvalSampler(Sampler[int]):
    """Rank r takes indices r, r+W, r+2W, ...: no padding, so no sample is counted twice.

    Ranks may hold one sample more or less than each other; the runtime evens
    out the number of forward passes where the strategy needs it (FSDP).
    """

    def __init__(self, length: int, num_replicas: int, rank: int) -> None:
        self.indices = list(range(rank, length, num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
