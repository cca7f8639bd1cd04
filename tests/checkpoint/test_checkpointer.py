"""The Checkpointer over states handed in once: save(step), load(step), load() (the newest), in process (one rank)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from musubi.checkpoint import checkpoint as ckpt
from musubi.checkpoint.saver import Checkpointer
from musubi.checkpoint.states import CheckpointStates, Held
from musubi.config.job import CheckpointSpec
from musubi.contract.errors import ConfigError
from musubi.contract.inject import Injector
from musubi.contract.world import World

pytestmark = pytest.mark.timeout(120)


class Progress:
    """A train state like the Trainer's: a step and a data position, refused when it is not whole batches."""

    def __init__(self, batch: int) -> None:
        self.batch, self.step, self.samples = batch, 0, 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "samples": self.samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["samples"] % self.batch:
            raise ConfigError(f"data position {state['samples']} is not a whole number of batches of {self.batch}")
        self.step, self.samples = state["step"], state["samples"]


def _states(batch: int = 4) -> CheckpointStates:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return CheckpointStates(model, opt, train=Progress(batch), rank=Held({"seed": torch.tensor([0])}),
                            signature=ckpt.model_signature(model), scheduler=sched,
                            scaler=torch.amp.GradScaler("cpu", enabled=False))


def _checkpointer(root: Path, states: CheckpointStates, **spec: Any) -> Checkpointer:
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    return Checkpointer(root, CheckpointSpec(async_mode="off", keep_last=5, **spec), world, Injector(None, 0, None),
                        states)


def _train(states: CheckpointStates, step: int) -> None:
    """One optimizer step, the schedule, the train state and this rank's tensors move on."""
    states.model(torch.randn(3, 6)).square().mean().backward()
    states.optimizer.step()
    states.optimizer.zero_grad()
    assert states.scheduler is not None
    states.scheduler.step()
    progress = states.train
    assert isinstance(progress, Progress)
    progress.step, progress.samples = step, step * progress.batch
    states.rank.load_state_dict({"seed": torch.tensor([step])})


def _snapshot(states: CheckpointStates) -> dict[str, Any]:
    assert states.scheduler is not None
    return {"model": {k: v.clone() for k, v in states.model.state_dict().items()},
            "train": dict(states.train.state_dict()), "rank": states.rank.state_dict()["seed"].clone(),
            "lr": states.scheduler.get_last_lr()[0]}


def _same(states: CheckpointStates, snap: dict[str, Any]) -> None:
    assert states.scheduler is not None
    for k, v in states.model.state_dict().items():
        assert torch.equal(v, snap["model"][k]), k
    assert states.train.state_dict() == snap["train"]
    assert torch.equal(states.rank.state_dict()["seed"], snap["rank"])
    assert states.scheduler.get_last_lr()[0] == snap["lr"]


def test_save_by_step_then_load_a_step_or_the_newest(tmp_path: Path) -> None:
    states = _states()
    saver = _checkpointer(tmp_path / "checkpoints", states)
    snaps = {}
    for step in (2, 4):
        _train(states, step)
        saver.save(step)
        snaps[step] = _snapshot(states)
    state_json = ckpt.read_full_state(ckpt.step_dir(tmp_path / "checkpoints", 4))
    assert "model" in state_json and "optim" in state_json
    _train(states, 5)  # training moves on after the last save

    found = saver.load(step=2)
    assert found is not None and found.step == 2
    _same(states, snaps[2])
    found = saver.load()  # the newest
    assert found is not None and found.step == 4
    _same(states, snaps[4])
    saver.close()


def test_a_missing_step_and_a_refused_state_are_one_line_errors(tmp_path: Path) -> None:
    states = _states(batch=4)
    saver = _checkpointer(tmp_path / "checkpoints", states)
    assert saver.load(automatic=True) is None  # a torchrun restart with nothing saved: step 0
    with pytest.raises(ConfigError, match="no intact committed checkpoint"):
        saver.load()
    _train(states, 3)
    saver.save(3)
    with pytest.raises(ConfigError, match="no intact committed checkpoint in .*step-0+7"):
        saver.load(step=7)
    # a run with another batch cannot continue from this data position: the error names the checkpoint
    other = _states(batch=5)
    reader = _checkpointer(tmp_path / "checkpoints", other)
    with pytest.raises(ConfigError, match=r"step-0+3: data position 12 is not a whole number of batches of 5"):
        reader.load()
    saver.close()
    reader.close()


def test_a_disabled_checkpointer_saves_nothing_and_still_loads(tmp_path: Path) -> None:
    states = _states()
    writer = _checkpointer(tmp_path / "checkpoints", states)
    _train(states, 2)
    writer.save(2)
    off = _checkpointer(tmp_path / "checkpoints", _states(), enabled=False)
    assert not off.due_after_step(2, last=False, validated_next=False)
    assert not off.due_at_epoch_end(validated=True, last=True)
    found = off.load()
    assert found is not None and found.step == 2 and off.states.train.state_dict()["step"] == 2
    writer.close()
    off.close()
