"""The global batch and the LR that follows it: pure arithmetic both the launcher and the ranks use.

No torch here: the launcher plans (dry run, admission, OOM back-off) with the same numbers the
ranks train with, and `musubi/worker/batching.py` adds the probe and the collectives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError


def scale_lr(base_lr: float, global_batch: int, base_batch: int | None, rule: str) -> float:
    """The LR for `global_batch` samples, from one tuned at `base_batch` (linear, sqrt or none)."""
    if rule == "none" or base_batch is None:
        return base_lr
    ratio = global_batch / base_batch
    return base_lr * (ratio if rule == "linear" else math.sqrt(ratio))


def lr_line(lr: float, base_lr: float, base_batch: int | None, global_batch: int, rule: str) -> str:
    """The LR in force, the rule and the figures it came from, for the log's first lines."""
    if rule == "none" or base_batch is None:
        return f"lr {lr:.4g} (lr_rule none: train.lr as given, not scaled with the global batch {global_batch})"
    factor = f"{global_batch}/{base_batch}" if rule == "linear" else f"sqrt({global_batch}/{base_batch})"
    return f"lr {lr:.4g} = {base_lr:.4g} x {factor} ({rule} rule, base_batch {base_batch}) for global batch {global_batch}"


def rule_line(spec: JobSpec, world_size: int) -> str | None:
    """The launcher's first line when an LR scaling rule applies (None: train.lr is used as written)."""
    t = spec.train
    if t.lr_rule == "none" or t.base_batch is None:
        return None
    if t.batch == "auto":
        factor = "G" if t.lr_rule == "linear" else "sqrt(G"
        return (f"lr = {t.lr:.4g} x {factor}/{t.base_batch}{')' if t.lr_rule == 'sqrt' else ''} ({t.lr_rule} rule, "
                f"base_batch {t.base_batch}) once the batch probe fixes the global batch G")
    g = plan_batch(spec, world_size).global_batch
    return lr_line(scale_lr(t.lr, g, t.base_batch, t.lr_rule), t.lr, t.base_batch, g, t.lr_rule)


@dataclass
class BatchPlan:
    """How the global batch is made, and the LR that follows it."""

    per_rank: int
    accumulation: int
    world: int
    lr: float
    source: str = "config"  # config | probe | cache | oom-recovery | earlier attempt

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self.per_rank * self.world * self.accumulation


def plan_for(spec: JobSpec, per_rank: int, accumulation: int, world_size: int, source: str) -> BatchPlan:
    """A plan whose LR is the job's LR rule applied to this global batch."""
    g = per_rank * world_size * accumulation
    return BatchPlan(per_rank, accumulation, world_size, scale_lr(spec.train.lr, g, spec.train.base_batch,
                                                                  spec.train.lr_rule), source)


def plan_batch(spec: JobSpec, world_size: int) -> BatchPlan:
    """Per-rank batch from `batch` or `global_batch` (a number; `auto` is decided by `decide_batch`)."""
    t = spec.train
    if t.global_batch is not None:
        denom = world_size * t.accumulation
        if t.global_batch % denom:
            raise ConfigError(
                f"train.global_batch={t.global_batch} is not divisible by world x accumulation = "
                f"{world_size} x {t.accumulation}; pick a multiple of {denom} or change --nproc"
            )
        return plan_for(spec, t.global_batch // denom, t.accumulation, world_size, "config")
    if not isinstance(t.batch, int):
        raise ConfigError("train.batch is auto: the batch is decided by the probe (decide_batch)")
    return plan_for(spec, t.batch, t.accumulation, world_size, "config")
