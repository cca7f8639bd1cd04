"""Evaluation after training: FPS by one protocol, composite score, leaderboard, ONNX export.

Names are imported on first use, so `from musubi.evaluate import build_leaderboard`
does not import torch (the leaderboard is plain arithmetic over JSON files).

The Python API's `musubi.evaluate(JOB, ...)` is the function python_api.evaluate, which
musubi/__init__.py binds to that name (after importing this package, so the binding holds);
reach this package's modules with `from musubi.evaluate import leaderboard` or
`from musubi.evaluate.leaderboard import build_leaderboard`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_leaderboard": "musubi.evaluate.leaderboard",
    "read_leaderboard": "musubi.evaluate.leaderboard",
    "evaluate_job": "musubi.evaluate.job_eval",
    "export_job": "musubi.evaluate.onnx_export",
    "load_job_model": "musubi.evaluate.model_io",
    "torch_fps": "musubi.evaluate.fps",
    "onnx_fps": "musubi.evaluate.fps",
    "read_external_eval": "musubi.evaluate.external",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'musubi.evaluate' has no attribute {name!r}")
