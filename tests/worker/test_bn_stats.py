"""BatchNorm statistics recomputed before validation (musubi/worker/bn_stats.py), in process."""

from __future__ import annotations

import torch
from torch import nn

from musubi.contract.world import World
from musubi.worker.bn_stats import bn_modules, recalibrate_bn

ONE = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")


def _forward(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch)


def test_running_statistics_become_the_mean_of_the_batches_statistics() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    model.eval()
    stale = torch.full((3,), 7.0)
    model[1].running_mean.copy_(stale)  # what a lagging average leaves
    batches = [torch.randn(8, 4) * (i + 1) + i for i in range(3)]
    with torch.no_grad():
        feats = [model[0](b) for b in batches]
    used = recalibrate_bn(model, batches, _forward, ONE)
    bn = model[1]
    assert used == 3
    # Each batch counts the same: the mean of the batch means and of the (unbiased) batch variances.
    torch.testing.assert_close(bn.running_mean, torch.stack([f.mean(0) for f in feats]).mean(0))
    torch.testing.assert_close(bn.running_var, torch.stack([f.var(0, unbiased=True) for f in feats]).mean(0))
    assert bn.momentum == 0.1 and int(bn.num_batches_tracked) == 3
    assert not model.training  # the mode it was called in


def test_weights_are_untouched_and_models_without_batchnorm_are_skipped() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    before = {k: v.clone() for k, v in model.named_parameters()}
    recalibrate_bn(model, [torch.randn(2, 3, 8, 8)], _forward, ONE)
    assert all(torch.equal(before[k], v) for k, v in model.named_parameters())

    calls: list[int] = []
    plain = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
    assert not bn_modules(plain)
    assert recalibrate_bn(plain, [torch.randn(2, 2)], lambda m, b: calls.append(1), ONE) == 0 and not calls
