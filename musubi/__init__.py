"""Musubi: train a fleet of PyTorch models across many GPUs as one coordinated system."""

from __future__ import annotations

from typing import Any

from musubi.config.version import VERSION as __version__

#: The Python API (musubi/api.py), imported on first use: `import musubi` stays cheap (no torch).
_API = ("train", "run", "predict", "RunResult", "JobOutcome")

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from musubi import api

        return getattr(api, name)
    raise AttributeError(f"module 'musubi' has no attribute {name!r}")


def __dir__() -> list[str]:
    """`dir(musubi)` lists the API imported on first use (train, run, predict, ...) beside the module's own names."""
    return sorted({*globals(), *_API})
