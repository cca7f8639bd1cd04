"""The task contract: model + data + loss + metric, knowing nothing of distribution.

The runtime owns devices, process groups, samplers, precision and wrapping; a
task only says how to build a model, where samples come from, how a batch
becomes a loss, and how predictions become a metric. Metrics are reduced by the
runtime (it passes a sum-all-reduce callable), so a task never touches a
process group itself.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from musubi.config.job import JobSpec

#: Sums a tensor over all ranks and returns the result (identity on one rank).
Reducer = Callable[[torch.Tensor], torch.Tensor]


class Metric(abc.ABC):
    """Accumulates predictions of one validation pass; one instance per pass and rank."""

    @abc.abstractmethod
    def update(self, outputs: Any, batch: Any) -> None:
        """Add one batch's predictions (from `Task.predict`) and its targets."""

    @abc.abstractmethod
    def compute(self, reduce_sum: Reducer) -> dict[str, float]:
        """Global metric values; every rank calls this (it may run collectives through `reduce_sum`)."""


class Task(abc.ABC):
    """A model + data + loss + metric bundle built from a job spec."""

    #: Name of the headline metric (higher is better), e.g. "top1" or "map50".
    primary_metric: str = "val_loss"

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

    def validate(self) -> None:
        """Fail fast, before any worker starts: unknown model, missing files (raise ConfigError)."""
        return None  # tasks override; the default has nothing to check

    def preload(self) -> None:
        """Import the heavy libraries this job's model is built from, building nothing.

        The warm spare calls it before it forks ranks (musubi/worker/spare.py), so a rank does not import them
        again after the fork: an RT-DETR rank's transformers import was ~4.4 s of CPU per rank per launch.
        """
        return None  # tasks whose model needs more than their module's imports override

    def metric_names(self) -> frozenset[str] | None:
        """The names a validation of this task reports (its metric's keys), or None when it cannot say before one
        runs; the launcher checks checkpoint.best_metric and train.early_stop.metric against them."""
        return None

    def plan_spec(self) -> Any:
        """The model as the planner sees it (a `musubi.plan.spec.ModelSpec`), or None when it cannot say.

        Lets `musubi/plan` predict this job's memory and step time without importing torch.
        """
        return None

    def class_names(self) -> list[str] | None:
        """The name of each output class in label order, or None when the task has no classes.

        Detection: names[i] is label i + 1 (0 is background); classification: names[i] is label i.
        Recorded with every checkpoint, export and registry entry, so predictions can say what they found.
        """
        return None

    # -- model -------------------------------------------------------------
    @abc.abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model on the CPU (seeded by the runtime); nothing downloaded."""

    # -- data --------------------------------------------------------------
    @abc.abstractmethod
    def train_dataset(self) -> Dataset:
        """Map-style training set; `__getitem__` must be a pure function of the index."""

    def val_dataset(self) -> Dataset | None:
        """Map-style validation set, or None when the job has none."""
        return None

    def data_sizes(self) -> dict[str, int] | None:
        """Samples per split of data the task reads on its own ({"train": n, "val": m}), when it can tell them
        without reading the data; None: the dry run says "provided by task X" (the console counts them at start)."""
        return None

    def collate(self, samples: list[Any]) -> Any:
        """Samples -> batch (on the host)."""
        return default_collate(samples)

    def to_device(self, batch: Any, device: torch.device) -> Any:
        """Move a host batch to the device (non-blocking where memory is pinned)."""
        return move_to(batch, device)

    def use_device(self, device: torch.device) -> None:
        """The rank's device, told before the data sets are built: a task may choose device-side paths from it."""
        return None  # tasks that decode or augment on the device override

    def train_batch(self, batch: Any, device: torch.device, epoch: int) -> Any:
        """A host training batch made ready on the device for `epoch` (augmented where the task augments)."""
        return self.to_device(batch, device)

    def feed_path(self) -> dict[str, str]:
        """Where the feed's work happens: {"decode", "resize", "augment"} (shown at start, in summary.json)."""
        return {"decode": "loader workers", "resize": "loader workers", "augment": "none"}

    def feed_counts(self) -> dict[str, Any]:
        """Counters of the feed so far (e.g. images decoded on the host instead of the device), for summary.json."""
        return {}

    def feed_times(self) -> dict[str, dict[str, float]]:
        """Per-batch time of the task's stages of train_batch ({stage: {"batches", "host_ms", "device_ms"}})."""
        return {}  # tasks that time their decode/convert/augment stages override

    def batch_size_of(self, batch: Any) -> int:
        """Samples in a batch (for throughput figures)."""
        first = batch[0] if isinstance(batch, (list, tuple)) else batch
        return len(first)

    def device_batch(self, batch_size: int, device: torch.device, generator: torch.Generator) -> Any:
        """One synthetic batch generated directly on `device` (for `synthetic.on_device`)."""
        from musubi.contract.errors import ConfigError

        raise ConfigError(f"task {self.spec.task!r} has no on-device synthetic data; set synthetic.on_device: false")

    # -- step --------------------------------------------------------------
    @abc.abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Training forward: (scalar loss to backpropagate, detached named parts for logging)."""

    @abc.abstractmethod
    def predict(self, model: nn.Module, batch: Any) -> Any:
        """Evaluation forward (the runtime has set eval mode and no_grad)."""

    @abc.abstractmethod
    def make_metric(self, device: torch.device) -> Metric:
        """A fresh metric accumulator for one validation pass."""

    def eval_notes(self, model: nn.Module) -> dict[str, Any]:
        """What eval.json records beside the metrics about how `model` was scored (detection: the detections
        kept per image by the model and by the metric); {} by default."""
        return {}


def move_to(obj: Any, device: torch.device) -> Any:
    """Recursively move tensors in lists/tuples/dicts to `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        return {k: move_to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_to(v, device) for v in obj)
    return obj
