"""Helpers for end-to-end runtime tests: run `musubi train` and read back weights."""

from __future__ import annotations

from pathlib import Path

import torch
from typer.testing import CliRunner

from musubi.checkpoint.checkpoint import Committed, committed_checkpoints, latest_checkpoint, read_full_state
from musubi.cli import app
from musubi.launch.drill import final_tensors, flatten_tensors


def train(*args: str) -> tuple[int, str]:
    """Run `musubi train ARGS` in-process (workers are real torchrun processes)."""
    res = CliRunner().invoke(app, ["train", *args, "--device", "cpu"])
    return res.exit_code, res.output


def final_state(job_dir: Path) -> dict[str, torch.Tensor]:
    """Model and optimizer tensors of the newest committed checkpoint, flattened (the drill's reader)."""
    assert latest_checkpoint(job_dir / "checkpoints") is not None, f"no committed checkpoint in {job_dir}"
    return final_tensors(job_dir)


def every_tensor(ckpt: Committed) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint, flattened: weights, buffers, optimizer state, each rank's RNG."""
    return flatten_tensors(read_full_state(ckpt.path))


def committed_steps(job_dir: Path) -> dict[int, Committed]:
    """The committed checkpoints of a job, by step."""
    return {c.step: c for c in committed_checkpoints(job_dir / "checkpoints", warn=False)}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaN equals NaN: an RNG state keeps `no cached gauss` as NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))
