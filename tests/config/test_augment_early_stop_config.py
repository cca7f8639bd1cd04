"""data.augment's task defaults and refusals, train.early_stop's checks and what it turns on (keep_best)."""

from __future__ import annotations

from typing import Any

import pytest

from musubi.config.load import job_from_dict
from musubi.contract.errors import ConfigError


def job(task: str = "classification", data: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": "j", "task": task, "model": "resnet18" if task == "classification" else "fcos_resnet50_fpn",
            "data": data if data is not None else {"synthetic": {}}, **extra}


def test_augment_fills_each_tasks_defaults_and_round_trips() -> None:
    c = job_from_dict(job(data={"synthetic": {}, "augment": {}}), source="job.yaml")
    aug = c.data.augment
    assert aug is not None and aug.crop_scale == (0.08, 1.0) and aug.hflip == 0.5
    assert (aug.brightness, aug.contrast, aug.saturation) == (0.4, 0.4, 0.4)
    d = job_from_dict(job("detection", {"synthetic": {}, "augment": {}}), source="job.yaml")
    aug = d.data.augment
    assert aug is not None and aug.crop_scale is None and (aug.brightness, aug.contrast, aug.saturation) == (0, 0, 0)
    for spec in (c, d):  # job.json's resolved config reads back as itself (a --resume compares them)
        assert job_from_dict(spec.resolved(), source="job.json").resolved() == spec.resolved()
    # an explicit null turns the crop off; a value given is kept
    off = job_from_dict(job(data={"synthetic": {}, "augment": {"crop_scale": None, "brightness": 0.1}}),
                        source="job.yaml").data.augment
    assert off is not None and off.crop_scale is None and off.brightness == 0.1 and off.contrast == 0.4
    assert job_from_dict(job(), source="job.yaml").data.augment is None  # off unless asked


@pytest.mark.parametrize(("task", "data", "says"), [
    ("classification", {"synthetic": {}, "augment": {"mosaic": 0.5}}, "a classifier crops: use crop_scale"),
    ("classification", {"synthetic": {}, "augment": {"scale": [0.5, 1.5]}}, "a classifier crops"),
    ("detection", {"synthetic": {}, "augment": {"crop_scale": [0.5, 1.0]}}, "a crop cuts boxes"),
    ("detection", {"synthetic": {}, "augment": {"crop_ratio": [1.0, 2.0]}}, "a crop cuts boxes"),
    ("classification", {"synthetic": {}, "augment": {"crop_scale": [0.5, 1.5]}}, "crop_scale must be [low, high]"),
    ("classification", {"synthetic": {}, "augment": {"crop_ratio": [2.0, 1.0]}}, "crop_ratio must be [low, high]"),
    ("lm", {"synthetic": {}, "augment": {}}, "task lm does not use it"),
    ("detection", {"train": {"path": "x", "annotations": "a.json"}, "channels": 1, "augment": {"saturation": 0.2}},
     "remove saturation (brightness and contrast apply)"),
])
def test_augment_refusals_are_one_line(task: str, data: dict, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        job_from_dict(job(task, data), source="job.yaml")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_single_channel_detection_takes_brightness_and_contrast() -> None:
    spec = job_from_dict(job("detection", {"train": {"path": "x", "annotations": "a.json"}, "channels": 1,
                                           "augment": {"brightness": 0.02, "contrast": 0.2}}), source="job.yaml")
    assert spec.data.augment is not None and spec.data.augment.saturation == 0.0


def test_early_stop_keeps_the_best_checkpoint_by_its_metric() -> None:
    spec = job_from_dict(job(train={"early_stop": {"patience": 3}}), source="job.yaml")
    assert spec.train.early_stop is not None and spec.train.early_stop.min_delta == 0.0
    assert spec.checkpoint.keep_best == 1 and spec.checkpoint.best_metric is None  # the task's primary metric
    loss = job_from_dict(job(train={"early_stop": {"patience": 2, "metric": "val_loss"}}), source="job.yaml")
    assert (loss.checkpoint.best_metric, loss.checkpoint.best_mode) == ("val_loss", "min")
    assert loss.train.early_stop is not None and loss.train.early_stop.mode_for("val_loss") == "min"
    told = job_from_dict(job(train={"early_stop": {"patience": 2, "metric": "top5"}},
                             checkpoint={"keep_best": 0, "best_metric": "top1"}), source="job.yaml")
    assert (told.checkpoint.keep_best, told.checkpoint.best_metric) == (0, "top1")  # what the user set stays
    assert job_from_dict(told.resolved(), source="job.json").resolved() == told.resolved()


@pytest.mark.parametrize(("extra", "says"), [
    ({"data": {"synthetic": {"val_size": 0}}, "train": {"early_stop": {"patience": 2}}}, "no validation split"),
    ({"data": {"train": {"path": "x"}}, "train": {"early_stop": {"patience": 2}}}, "add data.val"),
    ({"train": {"early_stop": {"patience": 0}}}, "patience"),
    ({"train": {"early_stop": {"patience": 2, "min_delta": -1}}}, "min_delta"),
    ({"train": {"early_stop": {"patience": 2, "mode": "up"}}}, "mode"),
    ({"train": {"early_stop": {}}}, "patience"),
])
def test_early_stop_refusals_are_one_line(extra: dict, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        job_from_dict({**job(), **extra}, source="job.yaml")
    assert says in str(e.value) and "\n" not in str(e.value)
