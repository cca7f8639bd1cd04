"""A job's start weights: a local file, or torchvision's pretrained weights by name from the local cache.

`weights: DEFAULT` (or an enum member such as `COCO_V1`, or the qualified
`ResNet50_Weights.IMAGENET1K_V2`) names the model's own torchvision weights. They
are read from the torch hub cache, `$TORCH_HOME/hub/checkpoints/<file of the
weights' URL>` (default `~/.cache/torch/hub`), where torchvision itself keeps
them; nothing is downloaded: a missing file is a one-line error naming the exact
path and the URL to fetch it from on a machine with internet. Fine-tuning
changes the class count, so the weights are transferred: every tensor whose name
and shape match is loaded; the others (the classification head) keep their fresh
initialisation and are listed in the log. A local file is loaded strictly
(musubi.tasks.weights).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from musubi.contract.errors import ConfigError
from musubi.tasks.weights import check_weights, load_weights, read_state_dict

log = logging.getLogger(__name__)

#: DEFAULT, an enum member (COCO_V1), or Enum.MEMBER (ResNet50_Weights.IMAGENET1K_V2).
WEIGHTS_NAME = re.compile(r"^(?:(?P<enum>[A-Za-z][A-Za-z0-9_]*_Weights)\.)?(?P<member>[A-Z][A-Z0-9_]*)$")


def is_weights_name(value: str) -> bool:
    """True when `weights:` names torchvision weights (an existing file of that name is still a file)."""
    return bool(WEIGHTS_NAME.match(value)) and not Path(value).exists()


def resolve(model_name: str, value: str) -> Any:
    """The torchvision weights enum member `value` names for `model_name`; ConfigError naming the choices."""
    from torchvision.models import get_model_weights

    m = WEIGHTS_NAME.match(value)
    assert m is not None
    try:
        enum = get_model_weights(model_name)
    except ValueError:
        raise ConfigError(f"weights: {value!r}: torchvision has no pretrained weights for model {model_name!r}; "
                          "give a local weights file") from None
    if m["enum"] and m["enum"] != enum.__name__:
        raise ConfigError(f"weights: {value!r}: model {model_name} takes {enum.__name__}, not {m['enum']}")
    try:
        return enum[m["member"]]
    except KeyError:
        raise ConfigError(f"weights: {value!r}: {enum.__name__} has {', '.join(enum.__members__)}; "
                          "pick one (DEFAULT: the best)") from None


def cached_file(weights: Any) -> Path:
    """Where torchvision caches `weights`: the torch hub's checkpoints folder + the URL's file name."""
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(weights.url).path).name


def pretrained_state(model_name: str, value: str) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of the named weights from the local cache; ConfigError naming the file to place there."""
    weights = resolve(model_name, value)
    path = cached_file(weights)
    if not path.is_file():
        raise ConfigError(f"weights: {value} of {model_name} is not in the local cache: place {path} there "
                          f"(download {weights.url} on a machine with internet; Musubi never downloads)")
    return read_state_dict(path), path


def transfer(model: nn.Module, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The tensors of `state` that fit `model` by name and shape, and the model's keys left as initialised."""
    own = model.state_dict()
    fit = {k: v for k, v in state.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    return fit, [k for k in own if k not in fit]


def _fit_or_fail(model: nn.Module, state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    fit, fresh = transfer(model, state)
    if not fit:
        raise ConfigError(f"weights: {path}: no tensor fits model {type(model).__name__} by name and shape; "
                          "is it the weights of another model?")
    shown = [k for k in fresh if not k.endswith("num_batches_tracked")]
    log.info("weights: %d of %d tensors from %s; kept as initialised: %s", len(fit), len(model.state_dict()), path,
             ", ".join(shown[:6]) + (f", +{len(shown) - 6} more" if len(shown) > 6 else "") if shown else "none")
    return fit


def check_start_weights(value: str, model_name: str, model: nn.Module | None) -> None:
    """Launcher-side check of `weights:` (a file: strictly; a name: cached, loadable, fitting) against a meta model."""
    if not is_weights_name(value):
        check_weights(value, model)
        return
    state, path = pretrained_state(model_name, value)
    if model is not None:
        _fit_or_fail(model, state, path)


def load_start_weights(model: nn.Module, value: str, model_name: str) -> None:
    """Load `weights:` into `model`: a local file strictly, torchvision weights by transfer."""
    if not is_weights_name(value):
        load_weights(model, value)
        return
    state, path = pretrained_state(model_name, value)
    model.load_state_dict(_fit_or_fail(model, state, path), strict=False)
