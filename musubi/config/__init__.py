"""Validated configuration models (pydantic) and their YAML loading. No torch here."""

from musubi.config.errors import ConfigError
from musubi.config.job import JobSpec
from musubi.config.load import load_job

__all__ = ["ConfigError", "JobSpec", "load_job"]
