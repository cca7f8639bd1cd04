"""Helpers for end-to-end runtime tests: run `musubi train` and read back weights."""

from __future__ import annotations

from pathlib import Path

import torch
from typer.testing import CliRunner

from musubi.checkpoint.checkpoint import latest_checkpoint
from musubi.cli import app
from musubi.launch.drill import final_tensors


def train(*args: str) -> tuple[int, str]:
    """Run `musubi train ARGS` in-process (workers are real torchrun processes)."""
    res = CliRunner().invoke(app, ["train", *args, "--device", "cpu"])
    return res.exit_code, res.output


def final_state(job_dir: Path) -> dict[str, torch.Tensor]:
    """Model and optimizer tensors of the newest committed checkpoint, flattened (the drill's reader)."""
    assert latest_checkpoint(job_dir / "checkpoints") is not None, f"no committed checkpoint in {job_dir}"
    return final_tensors(job_dir)
