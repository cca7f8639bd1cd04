"""Rebuild a trained job's model: job.json's resolved config + the newest committed checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from musubi.checkpoint.checkpoint import STATE_FILE, read_full_state
from musubi.checkpoint.select import select_checkpoint
from musubi.config.job import JobSpec
from musubi.config.load import job_from_dict
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.store.rundir import read_json
from musubi.tasks.base import Task
from musubi.tasks.registry import build_task


@dataclass
class JobModel:
    """A job's task and its model (eval mode, CPU) loaded from a committed checkpoint."""

    job_dir: Path
    spec: JobSpec
    task: Task
    model: nn.Module
    checkpoint: Path
    step: int
    #: The class names the checkpoint recorded (state.json "classes"), or None for one written before they were.
    classes: list[str] | None = None


def is_task_job(job_dir: Path) -> bool:
    """True when job.json holds a Musubi task config (not an external command job)."""
    record = _job_record(job_dir)
    config = record.get("config") if isinstance(record, dict) else None
    return isinstance(config, dict) and "task" in config and "command" not in config


def _job_record(job_dir: Path) -> dict[str, Any]:
    path = job_dir / RUN_FILES.job
    if not path.is_file():
        return {}
    try:
        data = read_json(path)
    except (OSError, ValueError):
        raise ConfigError(f"{path}: not readable JSON; restore it from the run or re-run the job") from None
    return data if isinstance(data, dict) else {}


def no_job_record(job_dir: Path) -> str:
    """Why a folder without job.json has no Musubi model to rebuild, in one line (an external job says where its
    model is)."""
    job_dir = Path(job_dir)
    if not job_dir.is_dir():
        return f"{job_dir}: no such job directory; give RUN/JOB of a run"
    if not any((job_dir / f).is_file() for f in (RUN_FILES.eval, RUN_FILES.metrics_from, RUN_FILES.onnx)):
        return f"{job_dir}: not a job directory (no job.json, eval.json or model.onnx); give RUN/JOB of a run"
    model = job_dir / RUN_FILES.onnx
    if model.is_file():
        return (f"{job_dir}: an external job (its program trained it, Musubi has no checkpoint of it); its model is "
                f"already ONNX: {model}")
    return (f"{job_dir}: an external job with no model.onnx (its program trained it, Musubi has no checkpoint of "
            "it); have the program write model.onnx, or declare metrics_from: ultralytics so that `musubi evaluate` "
            "exports its weights/best.pt")


def read_job_spec(job_dir: Path) -> JobSpec:
    """The resolved JobSpec recorded in JOB/job.json (ConfigError if absent or invalid)."""
    path = job_dir / RUN_FILES.job
    if not path.is_file():
        raise ConfigError(no_job_record(job_dir))
    config = _job_record(job_dir).get("config")
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: no job config (key 'config'); is {job_dir} a Musubi task job directory?")
    return job_from_dict(config, source=str(path))


def load_job_model(job_dir: Path, checkpoint: str | int | None = None) -> JobModel:
    """The job's model with a committed checkpoint's weights (`checkpoint`: best, last or a step; default
    the newest), loaded strictly, in eval mode."""
    job_dir = Path(job_dir)
    spec = read_job_spec(job_dir)
    task = build_task(spec)
    # Sizes and SHA-256 checksums: a damaged newer checkpoint is skipped for the previous good one, with
    # a warning naming it (as training's resume does), so evaluate/export/registry never load broken weights.
    ckpt = select_checkpoint(job_dir / RUN_FILES.checkpoints, checkpoint, spec.checkpoint.best_metric or task.primary_metric,
                             spec.checkpoint.best_mode)
    model = task.build_model()
    state = read_full_state(ckpt.path, verified=True, keys=frozenset({"model"})).get("model")
    if not isinstance(state, dict):
        raise ConfigError(f"{ckpt.path}: holds no model state; pick another checkpoint")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = " ".join(str(e).split())[:200]
        raise ConfigError(
            f"{ckpt.path}: does not fit the model of job.json ({first}); was job.json edited after training?"
        ) from None
    model.eval()
    return JobModel(job_dir, spec, task, model, ckpt.path, ckpt.step, _recorded_classes(ckpt.path))


def _recorded_classes(ckpt_dir: Path) -> list[str] | None:
    """The class names a checkpoint's state.json records (training writes them since issue 42), or None."""
    try:
        names = read_json(ckpt_dir / STATE_FILE).get("classes")
    except (OSError, ValueError, AttributeError):
        return None
    return [str(n) for n in names] if isinstance(names, list) else None


def sample_batch(task: Task, count: int = 1, start: int = 0) -> Any:
    """`count` real samples (validation split, else training split) collated into one host batch."""
    data = task.val_dataset()
    if data is None or len(data) == 0:  # type: ignore[arg-type]
        data = task.train_dataset()
    n = len(data)  # type: ignore[arg-type]
    if n == 0:
        raise ConfigError(f"job {task.spec.name!r}: its data set is empty; nothing to run the model on")
    return task.collate([data[(start + i) % n] for i in range(count)])


@torch.no_grad()
def predict(job: JobModel, batch: Any) -> Any:
    """The task's evaluation forward on a host batch (CPU)."""
    return job.task.predict(job.model, batch)
