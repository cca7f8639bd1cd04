"""Early stopping: patience on a validation metric, the same state and the same decision on every rank.

Every rank computes the validation metrics from all-reduced sums, but a metric computed on each rank (mAP's
matching, a user task's compute) need not agree to the last bit; so the watched value is rank 0's, broadcast
(`World.broadcast_from_main`), and every rank then updates the same state with the same number and stops at
the same step: no rank waits in a collective for a peer that stopped. The state rides in the checkpoint's
trainer state, so a resumed run keeps its best value and its count of validations without improvement.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from musubi.config.job import EarlyStopSpec


@dataclass
class EarlyStop:
    """Patience on one validation metric: the best value so far and the validations since it."""

    metric: str
    mode: str  # "max" or "min"
    patience: int
    min_delta: float
    best: float | None = None
    best_step: int = -1
    bad: int = 0  # validations in a row without improvement
    stopped_step: int | None = None

    @classmethod
    def from_spec(cls, spec: EarlyStopSpec, primary_metric: str) -> EarlyStop:
        """The watcher of train.early_stop (its metric, else the task's primary one)."""
        metric = spec.metric or primary_metric
        return cls(metric=metric, mode=spec.mode_for(metric), patience=spec.patience, min_delta=spec.min_delta)

    def improved(self, value: float) -> bool:
        """Whether `value` beats the best so far by more than min_delta (NaN never does; the first finite one does)."""
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        gain = value - self.best if self.mode == "max" else self.best - value
        return gain > self.min_delta

    def observe(self, value: float, step: int) -> bool:
        """Count one validation's `value` at `step`; True when patience has run out (training should stop)."""
        if self.improved(value):
            self.best, self.best_step, self.bad = value, step, 0
        else:
            self.bad += 1
        return self.bad >= self.patience

    def reason(self) -> str:
        """One line: why training stopped."""
        best = "none" if self.best is None else f"{self.best:.4g} at step {self.best_step}"
        return (f"{self.metric} has not improved by more than {self.min_delta:g} ({self.mode}) for {self.bad} "
                f"validation(s) (patience {self.patience}); best {best}")

    def state_dict(self) -> dict[str, Any]:
        """The state a checkpoint carries (plain JSON values)."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Continue from a checkpoint's state; False (and nothing loaded) when it watched another metric or mode."""
        if state.get("metric") != self.metric or state.get("mode") != self.mode:
            return False
        best, stopped = state.get("best"), state.get("stopped_step")
        self.best = None if best is None else float(best)
        self.best_step, self.bad = int(state.get("best_step", -1)), int(state.get("bad", 0))
        self.stopped_step = None if stopped is None else int(stopped)  # the checkpoint of the stop itself
        return True

    def record(self) -> dict[str, Any]:
        """summary.json's and job.json's `early_stop`: where it stopped, why, and the best validation."""
        return {**self.state_dict(), "reason": self.reason()}
