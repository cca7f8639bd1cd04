"""Helpers for end-to-end runtime tests: run `musubi train` and read back weights."""

from __future__ import annotations

from pathlib import Path

import torch
from typer.testing import CliRunner

from musubi.cli import app
from musubi.runtime.checkpoint import latest_checkpoint, read_full_state


def train(*args: str) -> tuple[int, str]:
    """Run `musubi train ARGS` in-process (workers are real torchrun processes)."""
    res = CliRunner().invoke(app, ["train", *args, "--device", "cpu"])
    return res.exit_code, res.output


def final_state(job_dir: Path) -> dict[str, torch.Tensor]:
    """Model and optimizer tensors of the newest committed checkpoint, flattened."""
    ck = latest_checkpoint(job_dir / "checkpoints")
    assert ck is not None, f"no committed checkpoint in {job_dir}"
    full = read_full_state(ck.path)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, torch.Tensor):
            flat[prefix] = node
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(f"{prefix}.{i}", v)

    walk("", {"model": full["model"], "optim": full["optim"]})
    return flat
