"""The model-name table the launcher checks before torch: generated from torchvision, kept in step by this test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from musubi.contract.errors import ConfigError
from musubi.tasks.model_check import check_model


def test_the_committed_table_is_what_the_installed_torchvision_generates() -> None:
    """A torchvision update that adds or drops a model fails here (run `python -m musubi.tasks.model_table`)."""
    from musubi.tasks.model_table import TABLE, render

    assert Path(TABLE).read_text(encoding="utf-8") == render(), \
        "musubi/tasks/model_names.py is stale: run python -m musubi.tasks.model_table"


@pytest.mark.parametrize("task, name, words", [
    ("classification", "resnet1800", "unknown classification model 'resnet1800' (did you mean resnet18"),
    ("classification", "fasterrcnn_resnet50_fpn", "is a detection model: set task: detection"),
    ("classification", "raft_large", "an optical-flow model"),
    ("classification", "quantized_mobilenet_v2", "train its float model, e.g. mobilenet_v2"),
    ("detection", "resnet50", "resnet50 is a classification model; set task: classification"),
    ("detection", "maskrcnn_resnet50_fpn", "Mask R-CNN trains on instance masks"),
    ("detection", "ssd300", "unknown detection model 'ssd300' (did you mean ssd300_vgg16"),
    ("lm", "gtp", "unknown lm model 'gtp'"),
])
def test_a_model_its_task_cannot_build_is_refused_by_name(task: str, name: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_model(task, name)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_known_models_and_user_tasks_pass() -> None:
    for task, name in (("classification", "resnet18"), ("classification", "timm/anything"),
                       ("detection", "rtdetr_r18"), ("detection", "efficientdet_d0"), ("lm", "gpt"),
                       ("mypkg.tasks:make", "whatever")):
        check_model(task, name)


def test_the_check_imports_no_torch() -> None:
    code = ("import sys; from musubi.tasks.model_check import check_model; check_model('detection', 'ssdlite320_"
            "mobilenet_v3_large'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
