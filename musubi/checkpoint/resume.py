"""Resume: find the newest intact committed checkpoint that every rank agrees on, load it, restore the state.

Rank 0 checks sizes and checksums, newest first, skipping damaged ones with a warning; the others
take its choice and check that they see the same intact directory. The model and optimizer are
loaded in place (DCP); the scheduler and scaler from the trainer state of `state.json`; the data
position comes back in micro-batches of the batch the run has now.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from musubi.checkpoint import checkpoint as ckpt
from musubi.contract.errors import ConfigError
from musubi.contract.world import World

log = logging.getLogger("musubi.checkpoint")


@dataclass
class Resumed:
    """Where training continues, read from a checkpoint."""

    path: Path
    step: int
    epoch: int
    micro: int  # micro-batches of `epoch` already consumed
    rank_state: dict[str, torch.Tensor]  # this rank's RNG states, to restore
    last_eval: dict[str, float] = field(default_factory=dict)
    last_eval_step: int = -1
    early_stop: dict[str, Any] | None = None  # train.early_stop's count (best value, validations since it)


def find_agreed(root: Path, world: World, automatic: bool) -> ckpt.Committed | None:
    """Collective: the newest intact committed checkpoint every rank sees; None only when `automatic`.

    `automatic` (a torchrun restart, not the user's --resume): with no intact checkpoint, None
    (train from step 0) instead of a ConfigError.
    """
    mine = ckpt.latest_checkpoint(root, checksums=True) if world.is_main else None
    step = world.all_reduce_max(mine.step if mine is not None else -1)
    if step < 0:
        if automatic:
            log.warning("no intact committed checkpoint in %s: restarting from step 0", root)
            return None
        raise ConfigError(f"--resume: no intact committed checkpoint in {root}; run without --resume")
    found = mine if mine is not None else ckpt.verify(ckpt.step_dir(root, step))
    if world.all_reduce_min(1 if found is not None else 0) == 0 or found is None:
        raise ConfigError(f"{ckpt.step_dir(root, step)}: not intact on every rank; check that "
                          "all ranks see the same checkpoint directory (a shared filesystem)")
    return found


def resume_latest(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: World,
                  signature: str, rank_template: dict[str, torch.Tensor], scheduler: Any, scaler: Any,
                  per_rank: int, global_batch: int, automatic: bool = False) -> Resumed | None:
    """Collective: load the agreed checkpoint into model, optimizer, scheduler and scaler; None: nothing to resume."""
    found = find_agreed(root, world, automatic)
    if found is None:
        return None
    state, rank_state = ckpt.load_checkpoint(found, model, optimizer, rank_template, world, signature)
    if state.get("global_batch") != global_batch:
        log.warning("global batch changed since the checkpoint (%s -> %s): the resume is not exact",
                    state.get("global_batch"), global_batch)
    # The data position is kept in samples of this rank, not micro-batches: it stays valid when an OOM
    # recovery changes the micro-batch size.
    samples = int(state["samples"])
    if samples % per_rank:
        raise ConfigError(f"{found.path}: data position {samples} is not a whole number of batches of "
                          f"{per_rank}; resume with the batch it was written with")
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    return Resumed(found.path, state["step"], state["epoch"], samples // per_rank, rank_state,
                   state.get("last_eval", {}), int(state.get("last_eval_step", -1)), state.get("early_stop"))
