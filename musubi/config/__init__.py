"""Validated configuration models (pydantic) and their YAML loading. No torch here.

`JobSpec` and `load_job` are loaded on first use, so `musubi.contract.errors` (imported by
data and runtime code) works where pydantic is not installed (bench/ on a bare GPU machine).
"""

from typing import Any

from musubi.contract.errors import ConfigError

__all__ = ["ConfigError", "JobSpec", "load_job"]


def __getattr__(name: str) -> Any:
    if name == "JobSpec":
        from musubi.config.job import JobSpec

        return JobSpec
    if name == "load_job":
        from musubi.config.load import load_job

        return load_job
    raise AttributeError(f"module 'musubi.config' has no attribute {name!r}")
