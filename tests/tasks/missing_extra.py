"""Hide an optional package from a module, as on a machine where its extra is not installed."""

from __future__ import annotations

import builtins
from types import ModuleType
from typing import Any

import pytest


def hide_package(monkeypatch: pytest.MonkeyPatch, module: ModuleType, package: str) -> None:
    """`module.find_spec(package)` says absent and `import package...` raises ImportError, for this test only.

    Both are patched: the task modules ask find_spec first (a one-line refusal naming the extra) and
    import lazily when building."""
    real_find_spec = module.find_spec
    monkeypatch.setattr(module, "find_spec", lambda name: None if name == package else real_find_spec(name))
    real_import = builtins.__import__

    def without(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == package:
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)
