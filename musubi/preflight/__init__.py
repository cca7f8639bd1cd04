"""Preflight: check the machine before a run spends an hour on it (`musubi check`).

Readings (`preflight.read`) gather what the machine says into plain dataclasses
(`preflight.readings`); checks (`preflight.checks`) are pure functions from
readings to one-line results. Entry points:

- `run_checks(...)` -> PreflightReport (launcher side, before any worker starts)
- `parse_gpu_ids`, `gpu_selection` -> the GPUs `musubi check` is asked for (musubi/cli/check.py)
- `diagnostic_env(job_dir)` -> hang-diagnostic variables for the workers
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from musubi.preflight.checks.disk import checkpoint_bytes_estimate
    from musubi.preflight.diagnostics import diagnostic_env
    from musubi.preflight.gpu_list import gpu_selection, parse_gpu_ids
    from musubi.preflight.read.data import data_targets
    from musubi.preflight.result import CheckResult, PreflightReport, Status, render
    from musubi.preflight.runner import run_checks

# Lazy: `import musubi.preflight` must not import torch (the launcher's checks and the CLI import it).
_EXPORTS = {
    "run_checks": "musubi.preflight.runner",
    "gpu_selection": "musubi.preflight.gpu_list",
    "parse_gpu_ids": "musubi.preflight.gpu_list",
    "diagnostic_env": "musubi.preflight.diagnostics",
    "checkpoint_bytes_estimate": "musubi.preflight.checks.disk",
    "data_targets": "musubi.preflight.read.data",
    "CheckResult": "musubi.preflight.result",
    "PreflightReport": "musubi.preflight.result",
    "Status": "musubi.preflight.result",
    "render": "musubi.preflight.result",
}
__all__ = [
    "CheckResult", "PreflightReport", "Status", "checkpoint_bytes_estimate", "data_targets", "diagnostic_env",
    "gpu_selection", "parse_gpu_ids", "render", "run_checks",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'musubi.preflight' has no attribute {name!r}")
