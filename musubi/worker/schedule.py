"""Learning rate: scaled with the global batch, then warmup and schedule."""

from __future__ import annotations

import math
from collections.abc import Callable


def scale_lr(base_lr: float, global_batch: int, base_batch: int, rule: str) -> float:
    """The LR for `global_batch` samples, from one tuned at `base_batch` (linear, sqrt or none)."""
    ratio = global_batch / base_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    return base_lr


def lr_line(lr: float, base_lr: float, base_batch: int, global_batch: int, rule: str) -> str:
    """The LR in force, the rule and the figures it came from, for the log's first lines."""
    if rule == "none":
        return f"lr {lr:.4g} (lr_rule none: train.lr as given, not scaled with the global batch {global_batch})"
    factor = f"{global_batch}/{base_batch}" if rule == "linear" else f"sqrt({global_batch}/{base_batch})"
    return (f"lr {lr:.4g} ({rule} rule from {base_lr:.4g} at {base_batch}) = {base_lr:.4g} x {factor} for global "
            f"batch {global_batch}")


def lr_factor(warmup_steps: int, total_steps: int, schedule: str) -> Callable[[int], float]:
    """Multiplier of the scaled LR at optimizer step `s` (for LambdaLR)."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
