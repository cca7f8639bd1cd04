"""Your own model and data in Musubi, with no `model:` and no `data:` in the job file: the task builds both.

Three interleaved spiral arms in the plane, one class an arm: a classic problem a straight line cannot
separate and a small MLP can. The points are generated here (sample i is a pure function of i and the
split, so every rank and every resume sees the same sample under the same index); put your own files in
`SpiralArms.__getitem__` instead. The model has two heads, the class and the point's distance from the
centre, so the loss has two named parts (`ce` and `radius`), logged apart in metrics.jsonl (loss_ce, loss_radius).

    musubi train examples/own_model/job.yaml --nproc 2      # from the repository root (the module's path)

The shape of a task is in docs/guides/own-model.md.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import Dataset

from musubi.tasks.base import Metric, Reducer, Task

ARMS = 3  # classes
TRAIN, VAL = 3072, 768  # samples per split
TURNS = 1.0  # how far each arm winds: more is harder (1.5: acc 0.84 in the same steps)
NOISE = 0.05  # standard deviation of the points around their arm
RADIUS_WEIGHT = 0.1  # the auxiliary head's share of the loss


class SpiralArms(Dataset):
    """Point i of a split: (x, y) on arm i % ARMS, its class and its radius (0 centre .. 1 outer end).

    The split is drawn at once from a generator seeded by `split_seed` (a few thousand points: cheap), so sample
    i is the same on every rank and after every resume; a data set of files reads file i here instead."""

    def __init__(self, size: int, split_seed: int) -> None:
        g = torch.Generator().manual_seed(split_seed)
        self.labels = torch.arange(size) % ARMS
        self.radii = torch.rand(size, generator=g)
        angle = 2 * math.pi * (TURNS * self.radii + self.labels / ARMS)
        self.points = (torch.stack([self.radii * torch.cos(angle), self.radii * torch.sin(angle)], dim=1)
                       + NOISE * torch.randn(size, 2, generator=g))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.points[i], self.labels[i], self.radii[i]


class SpiralNet(nn.Module):
    """A small MLP with two heads: class logits (B, ARMS) and, while training, the radius (B,).

    In eval mode it returns the logits alone (as torchvision's detectors return losses in training and
    detections in eval): validation, `musubi export` (ONNX, one output tensor) and `musubi predict` see one tensor."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                  nn.Linear(hidden, hidden), nn.GELU())
        self.classes = nn.Linear(hidden, ARMS)
        self.radius = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        if not self.training:
            return self.classes(h)
        return self.classes(h), self.radius(h).squeeze(1)


class Accuracy(Metric):
    """Correct and total over this rank's share of the validation split; the runtime sums them over ranks."""

    def __init__(self) -> None:
        self.correct = torch.zeros((), dtype=torch.float64)
        self.total = torch.zeros((), dtype=torch.float64)

    def update(self, outputs: torch.Tensor, batch) -> None:
        labels = batch[1].to(outputs.device)
        self.correct += (outputs.argmax(1) == labels).sum().cpu()
        self.total += len(labels)

    def compute(self, reduce_sum: Reducer) -> dict[str, float]:
        correct, total = reduce_sum(torch.stack([self.correct, self.total]))
        return {"acc": float(correct / total), "val_samples": float(total)}


class Spirals(Task):
    """The bundle Musubi trains: model, data, loss with named parts, metric."""

    primary_metric = "acc"  # the headline: validation accuracy (higher is better)

    def build_model(self) -> nn.Module:
        return SpiralNet(int(self.spec.model_args.get("hidden", 64)))

    def train_dataset(self) -> Dataset:
        return SpiralArms(TRAIN, split_seed=1)

    def val_dataset(self) -> Dataset | None:
        return SpiralArms(VAL, split_seed=2)

    def data_sizes(self) -> dict[str, int]:
        return {"train": TRAIN, "val": VAL}  # said by the dry run before any sample is made

    def loss(self, model: nn.Module, batch):
        x, label, radius = batch
        logits, predicted_radius = model(x)
        ce = nn.functional.cross_entropy(logits, label)
        mse = nn.functional.mse_loss(predicted_radius, radius)
        return ce + RADIUS_WEIGHT * mse, {"ce": ce.detach(), "radius": mse.detach()}

    def predict(self, model: nn.Module, batch) -> torch.Tensor:
        return model(batch[0])  # eval mode (set by the runtime): the class logits; the radius only helps training

    def make_metric(self, device: torch.device) -> Metric:
        return Accuracy()

    def class_names(self) -> list[str]:
        return [f"arm {k}" for k in range(ARMS)]


def make(spec) -> Task:  # noqa: ANN001 - a musubi JobSpec
    """`task: examples.own_model.spirals:make`: Musubi calls this with the job's spec."""
    return Spirals(spec)
