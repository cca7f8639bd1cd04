"""A gradient all-reduce whose sums do not depend on DDP's bucket layout (deterministic mode, 3+ ranks).

Why: DDP reduces gradients in buckets; it builds them once from the parameter order and rebuilds
them after the first step from the order gradients became ready. A resumed run's first step uses
the first layout again, so each gradient element sits at another offset of another bucket than in
the uninterrupted run. A ring all-reduce (gloo's and NCCL's) adds the ranks' values in an order
that depends on the element's chunk, so over 3+ ranks (a+b)+c becomes a+(b+c) and the resumed run
drifts by rounding (seen here: resnet18 on 4 gloo ranks, 156 of 184 tensors differed after a stop
and resume; 2 ranks stay exact since a+b == b+a). Gathering every rank's bucket and adding them in
rank order gives each element the same sum whatever the layout. It moves (W-1)/W x W/2 times more
bytes than a ring all-reduce (2x at 4 ranks), so it is used only when the job asks for
`train.deterministic` and has 3+ ranks.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.
from typing import Any

import torch
import torch.distributed as dist


def ordered_allreduce_hook(process_group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the mean of every rank's bucket, summed in rank order (layout-independent)."""
    group = process_group if process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    parts = [torch.empty_like(buf) for _ in range(world)]
    fut = dist.all_gather(parts, buf, group=group, async_op=True).get_future()

    def rank_ordered_mean(_: Any) -> torch.Tensor:
        total = parts[0]
        for p in parts[1:]:
            total.add_(p)
        return total.div_(world)

    return fut.then(rank_ordered_mean)


def needs_ordered_reduce(deterministic: bool, world_size: int, strategy: str) -> bool:
    """DDP with 3+ ranks under `train.deterministic` (FSDP2's reduce-scatter layout never changes)."""
    return deterministic and world_size >= 3 and strategy != "fsdp"
