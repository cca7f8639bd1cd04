"""Shared fixtures: tiny job files and a CLI runner that launches real torchrun jobs on CPU."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

TINY_JOB: dict[str, Any] = {
    "name": "tiny",
    "task": "tests.runtime.tiny_task:make",
    "model": "mlp",
    "data": {"synthetic": {"train_size": 128, "val_size": 30}, "workers": 0},
    "train": {"epochs": 2, "batch": 8, "lr": 0.1, "base_batch": 16, "log_every": 4, "seed": 3},
}


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


@pytest.fixture
def tiny_job(tmp_path: Path):
    """Write a tiny job YAML (with overrides) and return its path."""

    def make(**extra: Any) -> Path:
        data = _merge(TINY_JOB, extra)
        p = tmp_path / f"{data['name']}.yaml"
        p.write_text(yaml.safe_dump(data), encoding="utf-8")
        return p

    return make


@pytest.fixture(autouse=True)
def _cpu_and_repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run CPU ranks, from the repo root (user tasks resolve from the working directory)."""
    monkeypatch.setenv("MUSUBI_DEVICE", "cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(REPO)
    os.environ.pop("MUSUBI_INJECT", None)
