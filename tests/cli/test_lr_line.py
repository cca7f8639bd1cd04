"""The LR a user writes is the LR used; when a scaling rule applies, `musubi train`'s first line says so."""

from __future__ import annotations

from pathlib import Path

from musubi.launch.launch import prepare
from musubi.launch.request import TrainRequest


def _first_lines(job: Path, out: Path, nproc: int = 2) -> list[str]:
    """What `musubi train` says before it launches anything (prepare: no torchrun, no preflight)."""
    lines: list[str] = []
    prepare(TrainRequest(job_path=job, nproc=nproc, out=out, device="cpu", check=False, oversubscribe=True,
                         say=lines.append))
    return lines


def test_a_rule_is_said_on_the_first_line(tiny_job, tmp_path: Path) -> None:
    # tiny: lr 0.1 tuned at base_batch 16 (base_batch opts into the linear rule); batch 16 x 2 ranks = 32
    lines = _first_lines(tiny_job(train={"batch": 16}), tmp_path / "r")
    assert lines[0] == "lr 0.2 = 0.1 x 32/16 (linear rule, base_batch 16) for global batch 32"


def test_the_lr_written_is_used_and_nothing_is_said(tiny_job, tmp_path: Path) -> None:
    job = tiny_job(train={"batch": 16, "lr": 1e-3, "base_batch": None})
    assert not any(line.startswith("lr ") for line in _first_lines(job, tmp_path / "r"))
