"""What a checkpoint holds, handed to the Checkpointer once: it saves and loads these objects in place by step.

- `model`, `optimizer`: tensors written through DCP, each rank its part (sharded under FSDP);
- `rank`: this rank's own tensors (its RNG streams), one entry per rank;
- `train`, `scheduler`, `scaler`: the global training state (step, epoch, data position, the last
  validation, ...), the LR schedule and the loss scaler, the same on every rank: `state.json`,
  written by rank 0 (scheduler and scaler under their own keys).

Each is a *stateful* (torch's convention: `state_dict()` / `load_state_dict(state)`), so the
checkpoint package knows nothing of a trainer, a sampler or an RNG.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


class Stateful(Protocol):
    """torch's convention: a state to save, and loading one back in place."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Held:
    """A stateful over a plain dict: what a caller without a trainer saves (tests, benchmarks)."""

    state: dict[str, Any]

    def state_dict(self) -> dict[str, Any]:
        """The dict as it is now."""
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the loaded dict."""
        self.state = state


@dataclass
class CheckpointStates:
    """The live objects one rank's checkpoints hold (see the module docstring)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train: Stateful  # JSON-able global state; may raise ConfigError on load (a state it cannot continue from)
    rank: Stateful  # {name: tensor} of this rank; its current tensors give the shapes to load into
    signature: str  # the model's architecture (checkpoint.model_signature): a checkpoint of another is refused
    scheduler: Stateful | None = None
    scaler: Stateful | None = None

    def global_state(self) -> dict[str, Any]:
        """state.json's content now: the train state, with the scheduler's and the scaler's."""
        state = dict(self.train.state_dict())
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def rank_template(self) -> dict[str, torch.Tensor]:
        """Tensors of the right shapes for this rank's entry to be loaded into (DCP loads in place)."""
        return {k: torch.empty_like(v) for k, v in self.rank.state_dict().items()}

    def load_global(self, state: dict[str, Any]) -> None:
        """Put state.json's content back: the train state first (it may refuse it), then scheduler and scaler."""
        self.train.load_state_dict(state)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
