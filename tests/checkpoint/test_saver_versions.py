"""Asynchronous saves across the torch versions Musubi claims.

torch 2.11 (the GPU machine's) closes a `DefaultStager`'s deepcopy table at the end of every staging;
torch 2.14 (this machine's) does not. Reusing one stager therefore crashed every job at its second
asynchronous save on 2.11 only (`KeyError: <class 'type'>`). These tests make the installed torch
behave like 2.11 and save several times in every mode, then resume from the last save.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from musubi.checkpoint import checkpoint as ckpt
from musubi.checkpoint.saver import Checkpointer, stop_checkpoint_process
from musubi.checkpoint.states import CheckpointStates, Held
from musubi.config.job import CheckpointSpec
from musubi.contract.inject import Injector
from musubi.contract.world import World

staging = pytest.importorskip("torch.distributed.checkpoint.staging")

MODES = [
    "thread", "off",
    pytest.param("process", marks=pytest.mark.timeout(240)),
]


@pytest.fixture
def stager_closes_after_staging(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Emulate torch 2.11: `DefaultStager._stage` closes its StateDictStager after each staging. Records each
    stager that staged, the object itself: an id() alone may be reused once a stager is collected (it failed
    under load as "2 == 3" in a full run, 2026-11-27)."""
    original = staging.DefaultStager._stage
    calls: list[object] = []

    def stage_then_close(self, state_dict, **kwargs):
        out = original(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        calls.append(self)
        return out

    monkeypatch.setattr(staging.DefaultStager, "_stage", stage_then_close)
    return calls


def test_emulation_reproduces_the_2_11_crash(stager_closes_after_staging: list[object]) -> None:
    """The emulation is faithful: a reused stager fails at its second staging, as on torch 2.11."""
    stager = staging.DefaultStager(staging.StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                                          use_async_staging=False, use_non_blocking_copy=False))
    state = {"w": torch.randn(3), "meta": {"kind": torch.nn.Linear}}
    stager.stage(state)
    with pytest.raises(KeyError):
        stager.stage(state)


@pytest.mark.parametrize("reuse", [True, False], ids=["kept-buffers", "dcp-stager-per-save"])
@pytest.mark.parametrize("mode", MODES)
def test_three_async_saves_and_a_resume(tmp_path: Path, mode: str, reuse: bool,
                                        stager_closes_after_staging: list[object]) -> None:
    """Kept host buffers (replicated state) and DCP's own stager (sharded state) both survive 2.11."""
    if mode == "process":  # DCP's daemon takes its ranks from the default group, as under torchrun
        dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        _three_saves(tmp_path, mode, reuse, stager_closes_after_staging)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _three_saves(tmp_path: Path, mode: str, reuse: bool, stagings: list[object]) -> None:
    torch.manual_seed(0)
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    root = tmp_path / "checkpoints"
    train, rank = Held({}), Held({})
    states = CheckpointStates(model, opt, train=train, rank=rank, signature=ckpt.model_signature(model))
    saver = Checkpointer(root, CheckpointSpec(async_mode=mode, keep_last=5), world, Injector(None, 0, None), states)
    saver.reuse_buffers = reuse
    saved: dict[int, dict[str, torch.Tensor]] = {}
    sizes: list[int] = []
    for step in (2, 4, 6):
        for _ in range(2):  # training moves between saves (BatchNorm buffers too)
            model(torch.randn(16, 8)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        train.state, rank.state = {"step": step}, {"seed": torch.tensor([step])}
        saver.save(step)
        if reuse and mode != "off":  # the buffers of the first save are the ones of the later saves
            sizes.append(saver.host_buffer_bytes)
        saved[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if mode == "process":
        # Its daemon is ended once it left its loop (EOF on its pipe), not waited for through its interpreter's
        # teardown (seconds of gc over torch's modules): killed, though the grace is far longer than that.
        daemon = _dcp_daemon()
        saver.wait()
        stop_checkpoint_process(grace_s=120)
        assert not daemon.is_alive() and daemon.exitcode == -signal.SIGKILL, daemon.exitcode
    saver.close()
    assert len(set(sizes)) <= 1 and (not sizes or sizes[0] > 0), f"host buffers allocated again: {sizes}"
    records = saver.drain()
    assert [r["ok"] for r in records] == [True, True, True], records
    if mode != "off" and not reuse:
        assert len({id(s) for s in stagings}) == 3, "each asynchronous save stages through a stager of its own"
    if mode != "off" and reuse:
        assert not stagings, "replicated state is staged into the kept host buffers, not DCP's stager"
    for step, expected in saved.items():
        found = ckpt.step_dir(root, step)
        assert (found / ckpt.MARKER).is_file(), f"step {step} not committed"
        full = ckpt.read_full_state(found)
        for k, v in expected.items():
            assert torch.equal(full["model"][k], v), (step, k)
    last = ckpt.latest_checkpoint(root, checksums=True)
    assert last is not None and last.step == 6
    # resume: a fresh model and optimizer loaded from the last save hold what was saved
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    full = ckpt.read_full_state(last.path)
    fresh.load_state_dict(full["model"])
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, saved[6][k]), k


def _dcp_daemon() -> Any:
    """DCP's checkpoint process of this rank (multiprocessing.Process), started by the first process-mode save."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    assert executor._CHECKPOINT_PROCESS is not None, "no checkpoint process after a process-mode save"
    return executor._CHECKPOINT_PROCESS._save_process
