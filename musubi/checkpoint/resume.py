"""Resume: find the committed checkpoint every rank agrees on (the newest intact one, or a given step), load it.

Rank 0 checks sizes and checksums, newest first, skipping damaged ones with a warning; the others
take its choice and check that they see the same intact directory. The model and optimizer are
loaded in place (DCP), this rank's own tensors (its RNG streams) too; `state.json` goes back to
the train state, the scheduler and the scaler (checkpoint/states.py). The Checkpointer's `load`
is the way in (saver.py); these are its steps.
"""

from __future__ import annotations

import logging
from pathlib import Path

from musubi.checkpoint import checkpoint as ckpt
from musubi.checkpoint.states import CheckpointStates
from musubi.contract.errors import ConfigError
from musubi.contract.world import World

log = logging.getLogger("musubi.checkpoint")


def find_agreed(root: Path, world: World, automatic: bool, step: int | None = None) -> ckpt.Committed | None:
    """Collective: the committed checkpoint every rank sees intact, `step`'s or the newest; None only when `automatic`.

    `automatic` (a torchrun restart, not the user's --resume): with no intact checkpoint, None
    (train from step 0) instead of a ConfigError.
    """
    if world.is_main:
        mine = ckpt.latest_checkpoint(root, checksums=True) if step is None else ckpt.verify(
            ckpt.step_dir(root, step), checksums=True)
    else:
        mine = None
    agreed = world.all_reduce_max(mine.step if mine is not None else -1)
    if agreed < 0:
        where = root if step is None else ckpt.step_dir(root, step)
        if automatic:
            log.warning("no intact committed checkpoint in %s: restarting from step 0", where)
            return None
        raise ConfigError(f"--resume: no intact committed checkpoint in {where}; run without --resume")
    found = mine if mine is not None else ckpt.verify(ckpt.step_dir(root, agreed))
    if world.all_reduce_min(1 if found is not None else 0) == 0 or found is None:
        raise ConfigError(f"{ckpt.step_dir(root, agreed)}: not intact on every rank; check that "
                          "all ranks see the same checkpoint directory (a shared filesystem)")
    return found


def load_into(found: ckpt.Committed, states: CheckpointStates, world: World) -> None:
    """Collective: load `found` into the states handed to the Checkpointer (model, optimizer, rank, global state)."""
    state, rank_state = ckpt.load_checkpoint(found, states.model, states.optimizer, states.rank_template(), world,
                                             states.signature)
    try:
        states.load_global(state)
    except ConfigError as e:  # the train state refused it (e.g. a data position of another batch): say which one
        raise ConfigError(f"{found.path}: {e}") from None
    states.rank.load_state_dict(rank_state)
