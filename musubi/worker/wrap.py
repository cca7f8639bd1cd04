"""Distribution wrappers: DDP (replicate) or FSDP2 `fully_shard` (shard)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from musubi.contract.world import World

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


def needs_lockstep_eval(model: nn.Module) -> bool:
    """FSDP's forward is a collective, so every rank must run the same number of eval forwards."""
    return isinstance(model, FSDPModule)
