"""BatchNorm statistics recomputed at the weights being validated ("precise BN"), before each validation.

Why: BatchNorm's running averages (momentum 0.1) lag the weights. After a few dozen steps at a high LR they
still hold much of their initial values (mean 0, var 1) and the statistics of early batches whose weights are
gone. examples/classify-synthetic.yaml (16 steps, 2 CPU ranks) trained to a train-mode accuracy of 1.0 and
validated at 0.094 (chance) with val_loss 197; a bias-corrected running average did not help (the last
steps' weights still moved too much). Recomputing the averages from a few training batches at the final
weights gave 1.0, as Wu & Johnson ("Rethinking 'Batch' in BatchNorm", 2021) and detectron2's PreciseBN
hook do. The weights are untouched: a training-mode forward uses batch statistics, never the running ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from musubi.contract.world import World

#: The public BatchNorm classes (timm's BatchNormAct2d and the lazy ones derive from them).
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def bn_modules(model: nn.Module) -> list[nn.Module]:
    """The BatchNorm layers of `model` that keep running statistics (SyncBatchNorm too; FrozenBatchNorm not)."""
    return [m for m in model.modules()
            if isinstance(m, BATCH_NORMS) and m.track_running_stats and m.running_mean is not None]


def snapshot_bn(model: nn.Module) -> list[torch.Tensor]:
    """Copies of every BatchNorm's running statistics and counter (for `restore_bn`)."""
    return [t.clone() for m in bn_modules(model) for t in (m.running_mean, m.running_var, m.num_batches_tracked)]


@torch.no_grad()
def restore_bn(model: nn.Module, saved: list[torch.Tensor]) -> None:
    """Put back what `snapshot_bn` copied: a validation at a stop point leaves the trained state as it was."""
    live = [t for m in bn_modules(model) for t in (m.running_mean, m.running_var, m.num_batches_tracked)]
    for t, s in zip(live, saved, strict=True):
        t.copy_(s)


@torch.no_grad()
def recalibrate_bn(model: nn.Module, batches: Iterable[Any], forward: Callable[[nn.Module, Any], Any],
                   world: World) -> int:
    """Reset every BatchNorm's running mean and variance and recompute them over `batches`; batches used.

    `forward(model, batch)` runs a training-mode forward (the task's loss: its training batches are what it
    is sure to accept). Each batch counts the same (momentum None: a cumulative average). Ranks saw other
    batches; their averages are averaged (the per-batch variance training normalised by, as pycls and
    detectron2 do), so every rank validates with the same statistics. A collective when `world.size` > 1:
    every rank must call it with the same number of batches (FSDP's forward is one too).
    """
    layers = bn_modules(model)
    if not layers:
        return 0
    momenta = [m.momentum for m in layers]
    was_training = model.training
    for m in layers:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    used = 0
    try:
        for batch in batches:
            forward(model, batch)
            used += 1
    finally:
        for m, momentum in zip(layers, momenta, strict=True):
            m.momentum = momentum
        model.train(was_training)
    stats = [t for m in layers for t in (m.running_mean, m.running_var)]
    flat = torch.cat([t.reshape(-1).float() for t in stats])
    world.all_reduce_sum(flat).div_(world.size)
    offset = 0
    for t in stats:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
    return used
