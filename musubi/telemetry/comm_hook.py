"""A DDP comm hook that times the gradient sync: DDP's own all-reduce, plus a mark at the last bucket.

The hook does exactly what DDP does without a hook (divide by the world size,
all-reduce, same buckets), and tells the recorder when the last bucket became
ready on this rank: the end of its pre-sync backward compute. FSDP has no such
hook; there `backward` includes its reduce-scatter (documented).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from musubi.telemetry.spans import SpanRecorder


def attach(model: torch.nn.Module, recorder: SpanRecorder, reduce: Any = None) -> bool:
    """Register the timing hook on a DDP model; False (nothing done) for other wrappers.

    `reduce` is the all-reduce the hook times (DDP's own by default; the runtime passes its
    layout-independent one in deterministic mode): a DDP model takes one comm hook only.
    """
    if not recorder.enabled or not isinstance(model, DDP):
        return False
    allreduce = reduce or default_hooks.allreduce_hook

    def timed_allreduce(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if bucket.is_last():
            recorder.presync()
        return allreduce(state, bucket)

    model.register_comm_hook(None, timed_allreduce)
    return True
