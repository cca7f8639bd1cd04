"""Evaluation after training: FPS by one protocol, composite score, leaderboard, ONNX export.

Names are imported on first use, so `from musubi.evaluate import build_leaderboard`
does not import torch (the leaderboard is plain arithmetic over JSON files).

The package is also the Python API's `musubi.evaluate(JOB, ...)` (python_api.evaluate):
importing any module of it makes `musubi.evaluate` this package, so the package itself
is callable rather than one name meaning two things depending on what was imported first.
"""

from __future__ import annotations

import importlib
import sys
import types
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


class CallablePackage(types.ModuleType):
    """This package's type: calling it is `musubi.evaluate(job_dir, ...)`, the `musubi evaluate` command."""

    def __call__(self, job_dir: Any, **options: Any) -> dict[str, Any]:  # noqa: ANN401 - a path
        """python_api.evaluate(job_dir, **options): the job's eval.json record."""
        from musubi.evaluate.python_api import evaluate

        return evaluate(job_dir, **options)


sys.modules[__name__].__class__ = CallablePackage


def __getattr__(name: str) -> Any:
    if name == "__signature__":  # inspect.signature(musubi.evaluate) and help() show the call's keywords
        import inspect

        from musubi.evaluate.python_api import evaluate

        return inspect.signature(evaluate)
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'musubi.evaluate' has no attribute {name!r}")
