"""Local weights files: read safely (weights_only), unwrap common containers, match strictly.

Shared by every built-in task: nothing is downloaded, nothing but tensors and
containers is unpickled, and a key or shape mismatch is refused before the
model is touched.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from musubi.contract.errors import ConfigError

#: torch's weights_only refusal names the global it would not unpickle on this line.
_UNSUPPORTED = re.compile(r"Unsupported global: GLOBAL ([\w.]+)|unsupported GLOBAL ([\w.]+)", re.IGNORECASE)


def load_refusal(e: BaseException) -> str:
    """The reason of a `torch.load(weights_only=True)` failure, in a few words (the global it refused)."""
    m = _UNSUPPORTED.search(str(e))
    if m:
        return f"it would unpickle {m.group(1) or m.group(2)}, refused by weights_only loading"
    return " ".join(str(e).split())[:160] or type(e).__name__


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a local weights file (weights_only, on the CPU); unwraps {'model': ...}-style checkpoints."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"weights: {p}: no such file; give a local file saved with torch.save(model.state_dict())"
        )
    try:
        try:
            obj = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:
            obj = torch.load(p, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except Exception as e:
        raise ConfigError(
            f"weights: {p}: cannot load it safely ({load_refusal(e)}); save a plain state_dict"
        ) from None
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ConfigError(
            f"weights: {p}: not a state_dict of tensors; save it with torch.save(model.state_dict())"
        )
    # DDP and torch.compile wrappers prefix every key; the model here is unwrapped.
    for prefix in ("module.", "_orig_mod."):
        if obj and all(k.startswith(prefix) for k in obj):
            obj = {k[len(prefix) :]: v for k, v in obj.items()}
    return obj


def weights_mismatch(state: dict[str, torch.Tensor], model: nn.Module) -> str | None:
    """One-line description of how `state` fails to match the model's state_dict, or None."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} file {list(state[k].shape)} vs model {list(shape)}"
        for k, shape in expected.items()
        if k in state and tuple(state[k].shape) != shape
    ]
    parts = []
    for what, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)):
        if items:
            more = f", +{len(items) - 3} more" if len(items) > 3 else ""
            parts.append(f"{len(items)} {what} ({', '.join(items[:3])}{more})")
    return "; ".join(parts) or None


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a local weights file into `model` strictly; ConfigError naming the mismatch."""
    state = read_state_dict(path)
    problem = weights_mismatch(state, model)
    if problem:
        raise ConfigError(f"weights: {path} does not fit model {type(model).__name__}: {problem}")
    model.load_state_dict(state, strict=True)


def check_weights(path: str | Path, model: nn.Module | None) -> None:
    """Launcher-side check of a weights file against a (meta) model; None: only check it loads."""
    state = read_state_dict(path)
    if model is not None and (problem := weights_mismatch(state, model)):
        raise ConfigError(f"weights: {path} does not fit model {type(model).__name__}: {problem}")
