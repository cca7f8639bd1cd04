"""Musubi: train a fleet of PyTorch models across many GPUs as one coordinated system."""

from __future__ import annotations

from typing import Any

from musubi.config.version import VERSION as __version__

#: The Python API (musubi/api.py), imported on first use: `import musubi` stays cheap (no torch).
_API = ("train", "run", "predict", "evaluate", "export", "load", "RunResult", "JobOutcome", "Exported")

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name == "evaluate":
        # The package musubi.evaluate is callable as the API's evaluate: importing any of its modules binds
        # `musubi.evaluate` to the package anyway, so the one name means one thing (see its __init__).
        import musubi.evaluate

        return musubi.evaluate
    if name in _API:
        from musubi import api

        return getattr(api, name)
    raise AttributeError(f"module 'musubi' has no attribute {name!r}")


def __dir__() -> list[str]:
    """`dir(musubi)` lists the API imported on first use (train, run, predict, ...) beside the module's own names."""
    return sorted({*globals(), *_API})
