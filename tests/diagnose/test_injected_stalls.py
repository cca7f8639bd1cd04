"""Injected stalls land where the scenario suite expects them: the blocking part of a save.

The data stall's place (the wait for the batch, `data`, not `h2d`, step by step through the real loop) is
checked on the scenario suite's data-stall drill (test_scenarios.py), which trains that fault anyway: a launch of
its own here cost ~12 s of the suite for the same property.
"""

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

