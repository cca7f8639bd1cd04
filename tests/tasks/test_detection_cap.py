"""The detections an image keeps: the detector's own cap and mAP's, as eval.json records them."""

from __future__ import annotations

import pytest
import torch

from musubi.config.load import job_from_dict
from musubi.contract.errors import ConfigError
from musubi.tasks.detection_cap import max_detections_record, model_cap
from musubi.tasks.registry import build_task

DETECT = {"name": "d", "task": "detection", "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
          "data": {"synthetic": {"train_size": 4, "val_size": 2, "image_size": 64, "num_classes": 2, "objects": 7,
                                 "min_object": 8, "max_object": 16}, "workers": 0}}


def test_each_family_reports_the_cap_its_model_args_set() -> None:
    from torchvision.models.detection import (
        fasterrcnn_mobilenet_v3_large_320_fpn,
        ssdlite320_mobilenet_v3_large,
    )

    rcnn = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=3,
                                                 box_detections_per_img=300)
    assert model_cap(rcnn) == (300, "box_detections_per_img")
    ssd = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3)
    assert model_cap(ssd) == (ssd.detections_per_img, "detections_per_img") and ssd.detections_per_img >= 100
    assert model_cap(torch.nn.Linear(2, 2)) == (None, None)  # a user task's model: unknown, said so


def test_record_warns_when_a_frame_holds_more_objects_than_a_cap() -> None:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    rcnn = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=3)
    fine = max_detections_record(rcnn, None, 40)
    assert fine["metric"] == "all" and fine["model"] == 100 and "warning" not in fine
    assert fine["model_set_by"] == "model_args.box_detections_per_img"
    dense = max_detections_record(rcnn, None, 279)  # the aerial frame of 279 trees under torchvision's 100
    assert "279 objects" in dense["warning"] and "raise model_args.box_detections_per_img to at least 279" in \
        dense["warning"]
    metric = max_detections_record(rcnn, 50, 80)  # the metric's own cap is the smaller: it is named
    assert metric["metric"] == 50 and "raise eval.max_detections to at least 80" in metric["warning"]


def test_task_notes_name_both_caps_and_the_config_checks_the_field() -> None:
    task = build_task(job_from_dict({**DETECT, "eval": {"max_detections": 5}}))
    notes = task.eval_notes(task.build_model())["max_detections"]
    assert notes["metric"] == 5 and notes["model"] == 100 and notes["most_objects_in_a_validation_image"] == 7
    assert "eval.max_detections to at least 7" in notes["warning"]
    assert task.make_metric(torch.device("cpu")).max_detections == 5
    default = build_task(job_from_dict(DETECT))
    assert default.make_metric(torch.device("cpu")).max_detections is None  # every detection by default
    with pytest.raises(ConfigError, match="eval.max_detections caps detection mAP; task classification"):
        job_from_dict({"name": "c", "task": "classification", "model": "resnet18", "eval": {"max_detections": 9},
                       "data": {"synthetic": {}}})
    with pytest.raises(ConfigError, match="max_detections"):
        job_from_dict({**DETECT, "eval": {"max_detections": 0}})
