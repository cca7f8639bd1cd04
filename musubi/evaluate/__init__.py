"""Evaluation after training: FPS by one protocol, composite score, leaderboard, ONNX export.

Names are imported on first use, so `from musubi.evaluate import build_leaderboard`
does not import torch (the leaderboard is plain arithmetic over JSON files).
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
