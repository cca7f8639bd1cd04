"""Every torchvision detection builder is accepted (built and trained a step on CPU) or refused with its reason.

The list comes from torchvision itself (`list_models(module=torchvision.models.detection)`): a builder a
new torchvision adds fails here until the detection task accepts or refuses it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torchvision

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.tasks.detection import MODELS, REFUSED, DetectionTask, accepted_model_args, check_detection_model
from tests.tasks.detector_step import train_step_and_predict

pytestmark = pytest.mark.timeout(300)

TORCHVISION_DETECTORS = sorted(torchvision.models.list_models(module=torchvision.models.detection))


def _spec(model: str, **overrides: Any) -> JobSpec:
    synthetic = {"image_size": 64, "num_classes": 2, "objects": 2, "min_object": 8, "max_object": 24,
                 "train_size": 4, "val_size": 2}
    return JobSpec(name="det", task="detection", model=model, data={"synthetic": synthetic}, **overrides)


def test_every_torchvision_builder_is_accepted_or_refused_with_a_reason() -> None:
    assert set(TORCHVISION_DETECTORS) == set(MODELS) | set(REFUSED), "a torchvision detector neither accepted nor refused"
    for name in REFUSED:
        with pytest.raises(ConfigError, match=rf"{name} is refused: .*did you mean fasterrcnn_resnet50_fpn") as e:
            DetectionTask(_spec(name)).validate()
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("wrong, close", [("retinanet_resnet50_fpn_v3", "retinanet_resnet50_fpn_v2"),
                                          ("ssd300", "ssd300_vgg16"), ("fasterrcnn_resnet50_fpnv2",
                                                                       "fasterrcnn_resnet50_fpn_v2")])
def test_a_near_miss_gets_a_did_you_mean(wrong: str, close: str) -> None:
    with pytest.raises(ConfigError, match=rf"unknown detection model '{wrong}' \(did you mean {close}"):
        check_detection_model(wrong)


def test_a_classifier_named_as_a_detector_says_which_task() -> None:
    with pytest.raises(ConfigError, match="resnet50 is a classification model; set task: classification"):
        check_detection_model("resnet50")


def test_ssd_sizes_are_its_own() -> None:
    """SSD resizes every image to its fixed size (300 px, SSDlite 320): min_size/max_size are not its to take."""
    assert not {"min_size", "max_size"} & accepted_model_args("ssd300_vgg16")
    assert {"min_size", "max_size"} <= accepted_model_args("retinanet_resnet50_fpn_v2")
    with pytest.raises(ConfigError, match="ssd300_vgg16 takes no min_size"):
        DetectionTask(_spec("ssd300_vgg16", model_args={"min_size": 64})).validate()


#: Backbones heavy on CPU (ResNet-50, VGG-16 at SSD300's fixed 300 px: 6-19 s a forward/backward on this 2-core
#: machine under load, 2026-11-28): the slow tier. The MobileNet ones stay in the unit tier.
HEAVY = ("resnet50", "vgg16")
#: Two-stage detectors sample fewer proposals and RoIs here: a Faster R-CNN v2 box head on 512 RoIs x 2 images
#: took 11 s of forward alone (the same code path, a tenth of the work).
FEW_ROIS = {"rpn_pre_nms_top_n_train": 100, "rpn_post_nms_top_n_train": 50, "rpn_pre_nms_top_n_test": 100,
            "rpn_post_nms_top_n_test": 50, "box_batch_size_per_image": 32}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if any(h in n for h in HEAVY) else [])
                                  for n in sorted(MODELS)])
def test_each_accepted_builder_builds_and_trains_a_step(name: str) -> None:
    """weights=None, weights_backbone=None (nothing downloaded), 2 classes, one forward/backward of 2 images of
    64 px through the task (its size handling: resizing models fed at 64 px, SSD at its own size), then a
    prediction in eval mode."""
    t0 = time.perf_counter()
    torch.manual_seed(0)
    task = DetectionTask(_spec(name, model_args=FEW_ROIS if name.startswith("fasterrcnn") else {}))
    task.validate()
    train_step_and_predict(task)
    assert time.perf_counter() - t0 < 120, f"{name} took {time.perf_counter() - t0:.0f} s"
