"""Musubi: train a fleet of PyTorch models across many GPUs as one coordinated system."""

from __future__ import annotations

from typing import Any

from musubi.config.version import VERSION as __version__

# `musubi.evaluate` is the call (`musubi evaluate` as a function), bound here once and for good: importing the
# package musubi.evaluate (which this line does first) is what would otherwise bind the name to the package, and
# later imports of its modules never rebind it. The package keeps its modules: `from musubi.evaluate import
# leaderboard`. python_api imports no torch, so `import musubi` stays cheap.
from musubi.evaluate.python_api import evaluate

#: The rest of the Python API (musubi/api.py), imported on first use: `import musubi` stays cheap (no torch).
_API = ("train", "run", "predict", "export", "load", "RunResult", "JobOutcome", "Exported")

__all__ = ["__version__", "evaluate", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from musubi import api

        return getattr(api, name)
    raise AttributeError(f"module 'musubi' has no attribute {name!r}")


def __dir__() -> list[str]:
    """`dir(musubi)` lists the API imported on first use (train, run, predict, ...) beside the module's own names."""
    return sorted({*globals(), *_API})
