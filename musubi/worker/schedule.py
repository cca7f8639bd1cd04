"""Learning rate over the steps: warmup and schedule (the batch scaling rule is config/batch_plan.py)."""

from __future__ import annotations

import math
from collections.abc import Callable


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
