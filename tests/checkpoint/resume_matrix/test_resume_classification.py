"""The resume matrix (cases.py) for resnet18 under DDP, and its validation on 2 ranks, from one uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from musubi.evaluate.model_io import load_job_model, predict
from tests.checkpoint.resume_matrix.cases import MARKS, check_stop_and_resume, train_uninterrupted

pytestmark = MARKS
CASE = "classification-resnet18-ddp-accumulation"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The case trained to its end once: the resume check and the validation check both read it."""
    return train_uninterrupted(CASE, tmp_path_factory.mktemp("resnet18"))


def test_stop_and_resume_equals_uninterrupted(uninterrupted: tuple[Path, Path], tmp_path: Path) -> None:
    """Stopped and resumed == never stopped: every tensor of every common checkpoint, bitwise."""
    job, full = uninterrupted
    check_stop_and_resume(CASE, job, full, tmp_path)


def _offline_metrics(job_dir: Path) -> dict[str, float]:
    """The task's validation metrics of the final checkpoint, in one process over the whole set."""
    job = load_job_model(job_dir)
    data = job.task.val_dataset()
    metric = job.task.make_metric(torch.device("cpu"))
    for start in range(0, len(data), 4):
        batch = job.task.collate([data[i] for i in range(start, min(start + 4, len(data)))])
        metric.update(predict(job, batch), batch)
    return metric.compute(lambda t: t)


def test_ranks_evaluate_with_the_same_buffers(uninterrupted: tuple[Path, Path]) -> None:
    """A BatchNorm model validated on 2 DDP ranks scores like its checkpoint in one process: every rank
    used rank 0's running statistics (the ones saved), not the statistics of its own last batch."""
    _, jd = uninterrupted
    ranked = json.loads((jd / "eval.json").read_text())["metrics"]
    offline = _offline_metrics(jd)
    for k in ("top1", "val_loss"):
        assert ranked[k] == pytest.approx(offline[k], rel=1e-4), k
