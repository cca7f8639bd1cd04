"""The drill task (`musubi.diagnose.drill_task:make`): an MLP on generated data for telemetry drills.

Small enough for CPU ranks, with a step long enough (model_args.hidden, layers)
that injected faults stand out of scheduling noise. Used by the scenario suite
(`musubi.diagnose.drills`) and `bench/telemetry.py --cpu`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from musubi.tasks.base import Metric, Reducer, Task

FEATURES, CLASSES = 64, 8


class DrillSet(Dataset):
    """Sample i: features from a generator seeded by i; label from a fixed projection."""

    def __init__(self, n: int, offset: int = 0) -> None:
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.offset + i)
        x = torch.randn(FEATURES, generator=g)
        return x, torch.tensor(int(x[:CLASSES].argmax()))


class Accuracy(Metric):
    """Top-1 accuracy over all ranks."""

    def __init__(self) -> None:
        self.t = torch.zeros(2, dtype=torch.float64)

    def update(self, outputs, batch) -> None:  # noqa: ANN001 - task protocol
        self.t += torch.tensor([float((outputs.argmax(1).cpu() == batch[1].cpu()).sum()), len(batch[1])],
                               dtype=torch.float64)

    def compute(self, reduce_sum: Reducer) -> dict[str, float]:
        t = reduce_sum(self.t.clone())
        return {"acc": float(t[0] / max(float(t[1]), 1.0))}


class DrillTask(Task):
    """MLP classifier; width `model_args.hidden` (default 512), depth `model_args.layers` (default 3)."""

    primary_metric = "acc"

    def build_model(self) -> nn.Module:
        hidden = int(self.spec.model_args.get("hidden", 512))
        layers: list[nn.Module] = [nn.Linear(FEATURES, hidden), nn.ReLU()]
        for _ in range(int(self.spec.model_args.get("layers", 3)) - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(hidden, CLASSES))

    def train_dataset(self) -> Dataset:
        return DrillSet(self.spec.data.synthetic.train_size)

    def val_dataset(self) -> Dataset | None:
        n = self.spec.data.synthetic.val_size
        return DrillSet(n, offset=10**7) if n else None

    def loss(self, model, batch):  # noqa: ANN001, ANN201 - task protocol
        x, y = batch
        loss = nn.functional.cross_entropy(model(x), y)
        return loss, {"ce": loss.detach()}

    def predict(self, model, batch):  # noqa: ANN001, ANN201
        return model(batch[0])

    def make_metric(self, device) -> Metric:  # noqa: ANN001
        return Accuracy()


def make(spec) -> Task:  # noqa: ANN001
    """Factory used as `task: musubi.diagnose.drill_task:make`."""
    return DrillTask(spec)
