"""The drill task (`musubi.diagnose.drill_task:make`): an MLP on generated data for telemetry drills.

A small real MLP (model_args.hidden, layers) plus, with model_args.device_ms,
a stand-in for accelerator time: forward sleeps a third of it and backward two
thirds (the CPU is free meanwhile, as when a GPU computes). On a shared CPU
machine real arithmetic drifts with the neighbours' load; a sleeping "device"
keeps the drills' step time steady so that the faults injected through
MUSUBI_INJECT, not the neighbours, decide the diagnosis. The spans, the comm
hook, gloo and the detectors are the real ones. Used by the scenario suite
(`musubi.diagnose.drills`) and `bench/telemetry.py --cpu`.
"""

from __future__ import annotations

import time

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


class _DeviceTime(torch.autograd.Function):
    """Identity whose forward and backward each sleep a fixed time (a stand-in for kernels)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fwd_s: float, bwd_s: float) -> torch.Tensor:  # noqa: ANN001
        ctx.bwd_s = bwd_s
        time.sleep(fwd_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        time.sleep(ctx.bwd_s)
        return grad, None, None


class DeviceTime(nn.Module):
    """`device_ms` of simulated accelerator time per step: 1/3 in forward, 2/3 in backward."""

    def __init__(self, device_ms: float) -> None:
        super().__init__()
        self.fwd_s, self.bwd_s = device_ms / 3e3, 2 * device_ms / 3e3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not torch.is_grad_enabled():
            return x
        return _DeviceTime.apply(x, self.fwd_s, self.bwd_s)


class DrillTask(Task):
    """MLP classifier: `hidden` (128), `layers` (2), `device_ms` (0: real arithmetic only)."""

    primary_metric = "acc"

    def build_model(self) -> nn.Module:
        args = self.spec.model_args
        hidden = int(args.get("hidden", 128))
        layers: list[nn.Module] = [nn.Linear(FEATURES, hidden), nn.ReLU()]
        if float(args.get("device_ms", 0)) > 0:
            # First in the model: its backward runs last, just before the final gradient bucket.
            layers.insert(1, DeviceTime(float(args["device_ms"])))
        for _ in range(int(args.get("layers", 2)) - 1):
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
