"""Injected stalls land where the scenario suite expects them: the blocking part of a save, the data wait."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from musubi.checkpoint.saver import Checkpointer
from musubi.checkpoint.states import CheckpointStates, Held
from musubi.config.job import CheckpointSpec
from musubi.config.load import apply_overrides
from musubi.contract.errors import ConfigError
from musubi.contract.inject import Injector, parse
from musubi.contract.world import World

pytestmark = pytest.mark.timeout(120)


def _saver(tmp_path: Path, mode: str, inject: str) -> tuple[Checkpointer, torch.nn.Module, torch.optim.Optimizer]:
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    states = CheckpointStates(model, opt, train=Held({"step": 2}), rank=Held({"seed": torch.tensor([1])}),
                              signature="x")
    saver = Checkpointer(tmp_path / "checkpoints", CheckpointSpec(async_mode=mode), world,
                         Injector(inject, 0, None), states, "acc")
    return saver, model, opt


@pytest.mark.parametrize("phase, blocks", [("", True), (",phase=block", True), (",phase=write", False)])
def test_ckpt_stall_blocks_the_step_with_async_saves(tmp_path: Path, phase: str, blocks: bool) -> None:
    saver, model, opt = _saver(tmp_path, "thread", f"ckpt_stall:ms=1000{phase}")
    t0 = time.perf_counter()
    saver.save(2)
    returned = time.perf_counter() - t0  # what the training step waited for
    saver.wait()
    durable = time.perf_counter() - t0
    (rec,) = saver.drain()
    saver.close()
    assert rec["ok"] and durable >= 1.0
    if blocks:
        assert returned >= 1.0 and rec["blocked_s"] >= 1.0
    else:  # the background write is stalled; the step is not (a stall of 1 s: a busy machine's copy of a tiny
          # model's state stays far below it)
        assert returned < 1.0 and rec["blocked_s"] < 1.0


def test_ckpt_stall_phase_grammar() -> None:
    assert parse("ckpt_stall:ms=5")[0].params["phase"] == "block"
    with pytest.raises(ConfigError, match="phase must be one of block, write"):
        parse("ckpt_stall:ms=5,phase=commit")


@pytest.mark.parametrize("raw", ["off", "'off'", "false", "Off"])
def test_async_mode_off_is_accepted_from_set(raw: str) -> None:
    data = apply_overrides({"checkpoint": {}}, [f"checkpoint.async_mode={raw}"])
    assert CheckpointSpec(**data["checkpoint"]).async_mode == "off"


def test_data_stall_sleeps_in_the_data_wait(tiny_job, tmp_path: Path) -> None:
    """Through the real loop (1 rank, gloo): an injected data stall is recorded as `data`, not `h2d`."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, MUSUBI_INJECT="data_stall:ms=60")
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "musubi.cli", "train", str(tiny_job()), "--nproc", "1",
                          "--device", "cpu", "--out", str(out), "--no-check", "--set", "train.max_steps=8"],
                         capture_output=True, text=True, env=env, timeout=110)
    assert res.returncode == 0, res.stdout[-1000:] + res.stderr[-2000:]
    (tele,) = out.glob("*/telemetry/rank0.jsonl")
    steps = [r for r in map(json.loads, tele.read_text().splitlines()) if r.get("kind") == "step" and r["step"] > 1]
    assert steps
    for r in steps:
        assert r["host"].get("data", 0.0) >= 55.0 and r["host"].get("h2d", 0.0) < 30.0, r["host"]
