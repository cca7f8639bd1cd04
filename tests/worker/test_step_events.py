"""The step's events in process: hook order, fault hooks that undo themselves, the checkpointer's cadence."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from musubi.checkpoint.saver import Checkpointer
from musubi.checkpoint.states import CheckpointStates, Held
from musubi.config.job import CheckpointSpec
from musubi.contract.errors import ConfigError
from musubi.contract.inject import Injector
from musubi.contract.world import World
from musubi.recovery.watchdog import Heartbeat
from musubi.worker.step_events import (
    AFTER_BACKWARD,
    BEFORE_BACKWARD,
    BEFORE_FORWARD,
    LOSS,
    PHASE,
    STEP_END,
    InjectionHooks,
    StepEvents,
    attach_heartbeat,
)

pytestmark = pytest.mark.timeout(60)


def test_hooks_run_in_order_and_pipe_replaces_the_value() -> None:
    events = StepEvents()
    seen: list[str] = []
    events.on(STEP_END, lambda step: seen.append(f"a{step}"))
    events.on(STEP_END, lambda step: seen.append(f"b{step}"))
    events.fire(STEP_END, 3)
    assert seen == ["a3", "b3"]
    events.on(LOSS, lambda loss, step: None)  # None: unchanged
    events.on(LOSS, lambda loss, step: loss * step)
    assert events.pipe(LOSS, torch.tensor(2.0), 5).item() == 10.0
    with pytest.raises(ValueError, match="unknown step event 'step_begin'"):
        events.on("step_begin", print)


def test_heartbeat_moves_with_phases_and_steps() -> None:
    events, hb = StepEvents(), Heartbeat()
    attach_heartbeat(events, hb)
    events.fire(PHASE, "forward")
    assert hb.phase == "forward"
    seq = hb.seq
    events.fire(STEP_END, 7)
    assert (hb.step, hb.phase) == (7, "between steps") and hb.seq > seq


def _injection(spec: str, tmp_path: Path) -> tuple[StepEvents, torch.nn.Module]:
    model = torch.nn.Linear(4, 2)
    events = StepEvents()
    InjectionHooks(Injector(spec, 0, tmp_path / "inject"), model, torch.device("cpu"), len).attach(events)
    return events, model


def test_backward_oom_hook_is_removed_even_when_backward_raised(tmp_path: Path) -> None:
    events, model = _injection("oom:step=2,phase=backward", tmp_path)

    def micro_batch(step: int) -> None:
        loss = model(torch.randn(3, 4)).sum()
        events.fire(BEFORE_BACKWARD, step)
        try:
            loss.backward()
        finally:
            events.fire(AFTER_BACKWARD, step)

    micro_batch(1)
    with pytest.raises(torch.OutOfMemoryError, match="backward, step 2"):
        micro_batch(2)
    micro_batch(2)  # fired once: the hook left with the failed backward, the next one runs


def test_forward_oom_and_nan_fire_at_their_step(tmp_path: Path) -> None:
    events, _ = _injection("oom_above:batch=4; nan:step=3", tmp_path)
    events.fire(BEFORE_FORWARD, 1, [0] * 4)
    with pytest.raises(torch.OutOfMemoryError, match="batch 5 > simulated limit 4"):
        events.fire(BEFORE_FORWARD, 1, [0] * 5)
    assert events.pipe(LOSS, torch.tensor(1.0), 2).item() == 1.0
    assert torch.isnan(events.pipe(LOSS, torch.tensor(1.0), 3))


def _saver(tmp_path: Path, validated: bool = True, **spec: object) -> Checkpointer:
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    model = torch.nn.Linear(2, 2)
    states = CheckpointStates(model, torch.optim.SGD(model.parameters(), lr=0.1), train=Held({}), rank=Held({}),
                              signature="x")
    return Checkpointer(tmp_path, CheckpointSpec(async_mode="off", **spec), world, Injector(None, 0, None), states,
                        "acc", validated=validated)


def test_cadence_every_steps_and_keep_best(tmp_path: Path) -> None:
    s = _saver(tmp_path, every_steps=5)
    assert [k for k in range(1, 16) if s.due_after_step(k, last=False, validated_next=False)] == [5, 10, 15]
    assert not s.due_after_step(10, last=True, validated_next=False)  # the last step: saved at the end
    assert s.due_after_step(10, last=False, validated_next=True)  # no keep_best: the metric is not needed
    assert not s.due_at_epoch_end(validated=True, last=False)
    assert s.due_at_epoch_end(validated=False, last=True)
    best = _saver(tmp_path, every_steps=5, keep_best=1)
    assert not best.due_after_step(10, last=False, validated_next=True)  # waits for the validation
    assert best.due_at_epoch_end(validated=True, last=False) and not best.due_at_epoch_end(False, False)
    no_val = _saver(tmp_path, validated=False, every_steps=5, keep_best=1)
    assert not no_val.keeps_best and no_val.due_after_step(10, last=False, validated_next=True)
    assert _saver(tmp_path).due_at_epoch_end(validated=False, last=False)  # no every_steps: every epoch
    with pytest.raises(ConfigError, match="best_metric 'acc' is not a validation metric .* reports loss"):
        best.check_metric({"loss": 0.1, "eval_s": 1.0})
    _saver(tmp_path, every_steps=5).check_metric({"loss": 0.1})  # keep_best off: nothing to rank
