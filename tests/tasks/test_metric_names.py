"""Task.metric_names: what each built-in task declares is exactly what its validation reports (the launch refuses a
checkpoint.best_metric or train.early_stop.metric against it, launch/checks.py check_metric_names)."""

from __future__ import annotations

import pytest
import torch

from musubi.config.load import job_from_dict
from musubi.tasks.registry import build_task

SYNTHETIC = {
    "classification-2": {"task": "classification", "model": "resnet18",
                         "data": {"synthetic": {"train_size": 8, "val_size": 2, "image_size": 32, "num_classes": 2}}},
    "classification-10": {"task": "classification", "model": "resnet18",
                          "data": {"synthetic": {"train_size": 8, "val_size": 2, "image_size": 32,
                                                 "num_classes": 10}}},
    "detection": {"task": "detection", "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
                  "data": {"synthetic": {"train_size": 4, "val_size": 2, "image_size": 64, "num_classes": 2}}},
    "lm": {"task": "lm", "model": "gpt", "model_args": {"layers": 2, "hidden": 32, "heads": 4},
           "data": {"synthetic": {"train_size": 32, "val_size": 8, "seq_len": 16, "vocab": 48}}},
}


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_declared_names_are_the_keys_a_validation_reports(name: str) -> None:
    task = build_task(job_from_dict({"name": "m", **SYNTHETIC[name]}))
    reported = task.make_metric(torch.device("cpu")).compute(lambda t: t)  # no sample seen: every key, NaN or -1
    assert task.metric_names() == frozenset(reported) and task.primary_metric in reported
