"""Task lookup: built-in task names or a user task given as `module:function`."""

from __future__ import annotations

import importlib
import os
import sys

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.tasks.base import Task

#: Built-in task names: the module and class of each (imported on use; the warm spare pre-imports the module).
BUILTIN_TASK_CLASSES: dict[str, tuple[str, str]] = {
    "classification": ("musubi.tasks.classification", "ClassificationTask"),
    "detection": ("musubi.tasks.detection", "DetectionTask"),
    "lm": ("musubi.tasks.lm", "LMTask"),
}


def task_module(task: str) -> str | None:
    """The module a job's `task` lives in: a built-in's, or a user task's `module` of `module:function`."""
    if task in BUILTIN_TASK_CLASSES:
        return BUILTIN_TASK_CLASSES[task][0]
    return task.partition(":")[0] if ":" in task else None


def build_task(spec: JobSpec) -> Task:
    """The Task object for a job (validated by the caller with `task.validate()`)."""
    if spec.task in BUILTIN_TASK_CLASSES:
        module, cls = BUILTIN_TASK_CLASSES[spec.task]
        return getattr(importlib.import_module(module), cls)(spec)
    module_name, _, func_name = spec.task.partition(":")
    # Like `python -m`, resolve user modules from the working directory too (the
    # workers, started as `python -m`, see it; the console script would not).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"task: cannot import module {module_name!r} ({e}); put it on PYTHONPATH or fix the name"
        ) from None
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise ConfigError(f"task: {module_name!r} has no callable {func_name!r}; check the `module:function` name")
    task = factory(spec)
    if not isinstance(task, Task):
        raise ConfigError(
            f"task: {spec.task} returned {type(task).__name__}, not a musubi.tasks.base.Task subclass"
        )
    return task
