"""Every torchvision classifier is accepted at a size it takes, and a size it cannot take is refused before
launch with one it takes; a model of another family is refused with its reason."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchvision

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.tasks.classification import (
    DEFAULT_IMAGE_SIZE,
    ClassificationTask,
    create_model,
    meta_training_forward,
    torchvision_models,
)

pytestmark = pytest.mark.timeout(600)


def _task(model: str, size: int, **fields: Any) -> ClassificationTask:
    return ClassificationTask(JobSpec(name="c", task="classification", model=model,
                                      data={"synthetic": {"image_size": size, "num_classes": 3}}, **fields))


@pytest.mark.slow
def test_every_torchvision_classifier_is_accepted_at_the_default_size() -> None:
    """A training forward of each on the meta device at 224 px (no memory, no compute): 80 models."""
    names = torchvision_models()
    assert len(names) >= 80 and "inception_v3" in names and "maxvit_t" in names
    for name in names:
        _task(name, DEFAULT_IMAGE_SIZE).validate()


@pytest.mark.parametrize("model, size, takes", [("alexnet", 32, 64), ("inception_v3", 32, 96),
                                                ("maxvit_t", 64, 224), ("vit_h_14", 32, 224)])
def test_a_size_the_model_cannot_take_is_refused_with_one_it_takes(model: str, size: int, takes: int) -> None:
    with pytest.raises(ConfigError, match=rf"model: {model} cannot take {size}-px images \(.+\); it takes e.g. "
                                          rf"{takes} px: set data.synthetic.image_size") as e:
        _task(model, size).validate()
    assert "\n" not in str(e.value) and "model_args" not in str(e.value)
    _task(model, takes).validate()


@pytest.mark.parametrize("model, says", [
    ("fasterrcnn_resnet50_fpn_v2", "is a detection model: set task: detection"),
    ("fcn_resnet50", "is a segmentation model"),
    ("r3d_18", "is a video model"),
    ("raft_small", "is an optical-flow model"),
    ("quantized_resnet18", r"is a quantized model \(for inference\): train its float model, e.g. resnet18"),
    ("resnet51", r"unknown classification model 'resnet51' \(did you mean resnet50"),
])
def test_other_families_and_near_misses_say_why(model: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        _task(model, 64).validate()


def test_auxiliary_heads_are_left_out_so_every_parameter_learns() -> None:
    """GoogLeNet's aux heads would get no gradient from the task's loss (DDP refuses such parameters): built
    without them; asking for them is refused."""
    with pytest.raises(ConfigError, match="model_args.aux_logits: googlenet's auxiliary heads would get no gradient"):
        _task("googlenet", 32, model_args={"aux_logits": True}).validate()
    task = _task("googlenet", 32)
    task.validate()
    with torch.device("meta"):  # the graph on the meta device: no memory, no compute
        model = create_model("googlenet", 3, task.model_args()).train()
        logits = model(torch.empty(2, 3, 32, 32))  # a tensor: no auxiliary outputs beside it
        F.cross_entropy(logits, torch.zeros(2, dtype=torch.long)).backward()
    assert all(p.grad is not None for p in model.parameters()), "a parameter got no gradient"
    assert isinstance(torchvision.models.googlenet(weights=None, aux_logits=True, init_weights=False).aux1,
                      torch.nn.Module)  # the heads exist when asked: it is the default here that leaves them out


def test_the_size_checks_forward_runs_batchnorm_in_eval_mode_and_gives_it_back_in_training_mode() -> None:
    """The size check's meta forward (`meta_training_forward`) holds BatchNorm in eval mode (its training-mode
    statistics are Python decompositions on meta) and no other layer: the logits' shape is the plain training
    forward's, and every layer is in training mode again afterwards."""
    with torch.device("meta"):
        model = create_model("resnet18", 3, {})
        seen: list[bool] = []
        model.bn1.register_forward_hook(lambda m, i, o: seen.append(m.training))
        model.fc.register_forward_hook(lambda m, i, o: seen.append(m.training))
        logits = meta_training_forward(model, 64)
        assert logits.shape == model.train()(torch.empty(2, 3, 64, 64)).shape == (2, 3)
    assert seen[:2] == [False, True]  # BatchNorm in eval mode, the rest in training mode
    assert all(m.training for m in model.modules())
