"""`weights: DEFAULT` (or an enum name): torchvision's weights from a local torch hub cache, never downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision

from musubi.contract.errors import ConfigError
from musubi.tasks.classification import ClassificationTask
from musubi.tasks.detection import DetectionTask
from tests.tasks.test_classification import make_job
from tests.tasks.test_detection import _spec


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty torch hub cache under a temporary TORCH_HOME; its checkpoints folder."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url",
                        lambda *a, **k: pytest.fail("a download was attempted"))
    (tmp_path / "torch" / "hub" / "checkpoints").mkdir(parents=True)
    return tmp_path / "torch" / "hub" / "checkpoints"


def test_default_weights_come_from_the_cache_and_the_head_stays_fresh(hub: Path) -> None:
    torch.manual_seed(1)
    imagenet = torchvision.models.resnet18(num_classes=1000).state_dict()  # a stand-in for the real file
    # The exact name torchvision caches ResNet18_Weights.IMAGENET1K_V1 (= DEFAULT) under.
    torch.save(imagenet, hub / "resnet18-f37072fd.pth")
    for name in ("DEFAULT", "IMAGENET1K_V1", "ResNet18_Weights.IMAGENET1K_V1"):
        task = ClassificationTask(make_job(weights=name))  # 10 classes: the 1000-class head does not fit
        task.validate()
        state = task.build_model().state_dict()
        assert all(torch.equal(state[k], v) for k, v in imagenet.items() if not k.startswith("fc."))
        assert state["fc.weight"].shape == (10, 512)


def test_missing_or_unknown_weights_are_one_line_naming_the_file(hub: Path) -> None:
    with pytest.raises(ConfigError) as e:
        DetectionTask(_spec(model="fasterrcnn_mobilenet_v3_large_320_fpn", weights="DEFAULT")).validate()
    expected = hub / "fasterrcnn_mobilenet_v3_large_320_fpn-907ea3f9.pth"
    assert f"place {expected} there" in str(e.value) and "\n" not in str(e.value)
    assert "https://download.pytorch.org/models/fasterrcnn_mobilenet_v3_large_320_fpn-907ea3f9.pth" in str(e.value)
    with pytest.raises(ConfigError, match="ResNet18_Weights has IMAGENET1K_V1, DEFAULT; pick one"):
        ClassificationTask(make_job(weights="IMAGENET1K_V9")).validate()
    with pytest.raises(ConfigError, match="model resnet18 takes ResNet18_Weights, not ResNet50_Weights"):
        ClassificationTask(make_job(weights="ResNet50_Weights.DEFAULT")).validate()
    torch.save({"conv.weight": torch.zeros(1)}, hub / "resnet18-f37072fd.pth")  # a file of another model
    with pytest.raises(ConfigError, match="no tensor fits model ResNet by name and shape"):
        ClassificationTask(make_job(weights="DEFAULT")).validate()
