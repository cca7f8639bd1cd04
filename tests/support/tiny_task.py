"""A tiny user task (`tests.support.tiny_task:make`) for fast, exact runtime tests.

A two-layer MLP on a fixed random regression-as-classification set: no batch
norm and no dropout, so DDP over 2 ranks must equal 1 rank with twice the batch.
`model_args: {batchnorm: true}` adds a BatchNorm1d (running statistics: buffers
that each rank updates from its own batch), for the resume-exactness tests.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from musubi.tasks.base import Metric, Reducer, Task

FEATURES, CLASSES = 16, 4


class TinySet(Dataset):
    """Sample i: features drawn from a generator seeded by i, label from a fixed projection."""

    def __init__(self, n: int, offset: int = 0) -> None:
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.offset + i)
        x = torch.randn(FEATURES, generator=g)
        y = int(x[:CLASSES].argmax())
        return x, torch.tensor(y)


class AccMetric(Metric):
    def __init__(self) -> None:
        self.correct = torch.zeros((), dtype=torch.float64)
        self.total = torch.zeros((), dtype=torch.float64)

    def update(self, outputs, batch) -> None:
        self.correct += (outputs.argmax(1).cpu() == batch[1].cpu()).sum()
        self.total += len(batch[1])

    def compute(self, reduce_sum: Reducer) -> dict[str, float]:
        t = reduce_sum(torch.stack([self.correct, self.total]))
        return {"acc": float(t[0] / t[1]), "val_count": float(t[1])}


class TinyTask(Task):
    primary_metric = "acc"

    def build_model(self) -> nn.Module:
        hidden = int(self.spec.model_args.get("hidden", 32))
        norm = [nn.BatchNorm1d(hidden)] if self.spec.model_args.get("batchnorm") else []
        return nn.Sequential(nn.Linear(FEATURES, hidden), *norm, nn.Tanh(), nn.Linear(hidden, CLASSES))

    def train_dataset(self) -> Dataset:
        syn = self.spec.data.synthetic
        return TinySet(syn.train_size)

    def val_dataset(self) -> Dataset | None:
        syn = self.spec.data.synthetic
        return TinySet(syn.val_size, offset=10**6) if syn.val_size else None

    def loss(self, model, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(model(x), y)
        return loss, {"ce": loss.detach()}

    def predict(self, model, batch):
        return model(batch[0])

    def metric_names(self) -> frozenset[str]:
        return frozenset({"acc", "val_count"})

    def make_metric(self, device) -> Metric:
        return AccMetric()


def make(spec) -> Task:
    """Factory used as `task: tests.support.tiny_task:make`."""
    return TinyTask(spec)
