"""The tiny task with its own checks (`task: tests.launch.refusing_task:make`): `model_args.refuse: config` refuses the
job in one line (ConfigError), `model_args.refuse: crash` fails them with another exception (a bug in a user's task)."""

from __future__ import annotations

from musubi.contract.errors import ConfigError
from musubi.tasks.base import Task
from tests.support.tiny_task import TinyTask


class RefusingTask(TinyTask):
    """TinyTask whose validate() refuses as model_args.refuse says."""

    def validate(self) -> None:
        how = self.spec.model_args.get("refuse")
        if how == "config":
            raise ConfigError("model_args.hidden 7: this task needs an even width; set model_args.hidden: 8")
        if how == "crash":
            raise RuntimeError("the task's own check crashed")


def make(spec) -> Task:  # noqa: ANN001 - a JobSpec
    """Factory used as `task: tests.launch.refusing_task:make`."""
    return RefusingTask(spec)
