"""Distribution wrappers: DDP (replicate) or FSDP2 `fully_shard` (shard)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from musubi.runtime.world import World

try:  # public since torch 2.6
    from torch.distributed.fsdp import FSDPModule, fully_shard
except ImportError:  # pragma: no cover - older layouts
    from torch.distributed._composable.fsdp import FSDPModule, fully_shard  # type: ignore[no-redef]


def wrap_model(model: nn.Module, strategy: str, world: World) -> nn.Module:
    """Wrap a model already on its device for data-parallel training."""
    if strategy == "fsdp":
        # Shard each block first (the model may list them), then the root: one
        # all-gather per block in forward instead of one for the whole model.
        units = model.fsdp_units() if hasattr(model, "fsdp_units") else []
        for unit in units:
            fully_shard(unit)
        fully_shard(model)
        return model
    return DDP(
        model,
        device_ids=[world.device.index] if world.is_cuda else None,
        # Gradients live inside the all-reduce buckets: one copy less per step.
        gradient_as_bucket_view=True,
    )


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module (DDP's `.module`; FSDP2 shards in place, so itself)."""
    return model.module if isinstance(model, DDP) else model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on accumulation micro-steps (enabled=False)."""
    if isinstance(model, DDP) and not enabled:
        with model.no_sync():
            yield
        return
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
    yield


def eval_module(model: nn.Module) -> nn.Module:
    """What to call for evaluation: DDP's inner module (no buffer broadcast), FSDP itself."""
    return unwrap(model)


def agree_buffers(model: nn.Module, world: World) -> None:
    """Collective: every rank takes rank 0's buffers (BatchNorm running statistics and counters).

    Between steps each rank holds the running statistics of its own last batch: DDP broadcasts
    rank 0's only at the start of its next forward, and FSDP2 never does. A checkpoint stores one
    copy of a replicated tensor (DCP's planner picks the rank), and evaluation calls the inner
    module on every rank; both must use the buffers the next step would use, rank 0's. Under DDP
    this changes nothing that training reads (its next forward broadcasts the same values).
    """
    if world.size == 1 or not dist.is_initialized():
        return
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for b in unwrap(model).buffers():
        if b.numel():
            groups.setdefault((b.dtype, b.device), []).append(b)
    with torch.no_grad():
        for bufs in groups.values():  # one broadcast per dtype and device, not one per buffer
            flat = torch.cat([b.reshape(-1) for b in bufs])
            dist.broadcast(flat, src=0)
            offset = 0
            for b in bufs:
                b.copy_(flat[offset:offset + b.numel()].view_as(b))
                offset += b.numel()


def needs_lockstep_eval(model: nn.Module) -> bool:
    """FSDP's forward is a collective, so every rank must run the same number of eval forwards."""
    return isinstance(model, FSDPModule)
