"""The composite score: w_quality x quality + w_fps x FPS_norm, with the FPS normalisation stated.

quality is the task's headline metric, a fraction in [0, 1] where higher is
better: mAP50 for detection, top-1 accuracy for classification, next-token
accuracy (val_acc) for language models, the job's primary_metric otherwise.
FPS_norm is FPS / the best FPS among the ranked jobs (default), or
min(1, FPS / target) when a target FPS is configured (meeting it earns full
credit: a model faster than needed gains nothing more).

The quality floor keeps speed from winning alone: a job is ranked only when its
quality is above 0 and at least `quality_floor` x the best quality of the jobs
measured by the same metric; the others are listed, unranked, with the reason,
and their FPS does not set the FPS normalisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from musubi.config.errors import ConfigError

#: The quality metric by built-in task (user tasks: their primary_metric).
QUALITY_BY_TASK = {"detection": "map50", "classification": "top1", "lm": "val_acc"}
DEFAULT_WEIGHTS = (0.7, 0.3)
#: Share of the best quality (same metric) a job needs to be ranked: half as good as the best, and above 0.
DEFAULT_QUALITY_FLOOR = 0.5
#: Headline metrics, in the order they are picked when a job names no primary_metric.
KNOWN_PRIMARY = ("map50", "top1", "val_acc")


class Unscorable(Exception):
    """A job that cannot be scored; str() is the reason shown in the leaderboard."""


@dataclass(frozen=True)
class ScoreRule:
    """Weights of quality and normalised FPS, and the FPS target (None: the fleet's best)."""

    quality_weight: float = DEFAULT_WEIGHTS[0]
    fps_weight: float = DEFAULT_WEIGHTS[1]
    fps_target: float | None = None
    quality_floor: float = DEFAULT_QUALITY_FLOOR

    def __post_init__(self) -> None:
        for name, w in (("quality weight", self.quality_weight), ("fps weight", self.fps_weight)):
            if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
                raise ConfigError(f"leaderboard: {name} {w!r}: must be a finite number >= 0")
        if self.quality_weight + self.fps_weight <= 0:
            raise ConfigError("leaderboard: quality and fps weights are both 0; give at least one a weight > 0")
        if self.fps_target is not None and not (math.isfinite(self.fps_target) and self.fps_target > 0):
            raise ConfigError(f"leaderboard: fps target {self.fps_target!r}: must be a number > 0")
        if not (isinstance(self.quality_floor, (int, float)) and 0 <= self.quality_floor <= 1):
            raise ConfigError(f"leaderboard: quality floor {self.quality_floor!r}: must be a share in [0, 1] of the "
                              f"best quality (default {DEFAULT_QUALITY_FLOOR})")

    @property
    def floor_rule(self) -> str:
        """The quality floor in words."""
        return f"ranked when quality > 0 and >= {self.quality_floor:g} x the best quality of the same metric"

    def floor(self, best: float) -> float:
        """The lowest quality that is ranked, given the best of its metric (always above 0)."""
        return self.quality_floor * best

    @property
    def formula(self) -> str:
        """The score formula in words, with the weights."""
        return f"score = {self.quality_weight:g} x quality + {self.fps_weight:g} x fps_norm"

    def normalisation(self, base: float | None, best_job: str | None = None) -> str:
        """How FPS_norm was computed (stated in the leaderboard)."""
        if self.fps_weight == 0:
            return "fps not scored (weight 0)"
        if self.fps_target is not None:
            return f"fps_norm = min(1, fps / {self.fps_target:g}) (configured target fps)"
        if base is None:
            return "fps_norm = fps / best fps of the ranked jobs (no job was ranked)"
        return f"fps_norm = fps / {base:.4g} (best fps of the ranked jobs: {best_job})"


def quality_metric(task: str | None, record: dict[str, Any]) -> str:
    """Which metric is the quality of a job: the built-in task's, else eval.json's primary_metric (or a default)."""
    if task in QUALITY_BY_TASK:
        return QUALITY_BY_TASK[task]
    primary = record.get("primary_metric")
    if isinstance(primary, str) and primary:
        return primary
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    known = [m for m in KNOWN_PRIMARY if m in metrics]
    if known:
        return known[0]
    if len(metrics) == 1:
        return str(next(iter(metrics)))
    raise Unscorable("eval.json names no primary_metric")


def quality_value(metric: str, record: dict[str, Any]) -> float:
    """The metric's value as a fraction in [0, 1] (Unscorable with the reason otherwise)."""
    metrics = record.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise Unscorable("no metrics in eval.json")
    if metric not in metrics:
        raise Unscorable(f"eval.json has no {metric} (it has {', '.join(sorted(map(str, metrics))[:6])})")
    value = metrics[metric]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Unscorable(f"{metric} is {value!r}, not a finite number")
    if value == -1:
        raise Unscorable(f"{metric} is -1: the validation split has no ground truth for it")
    if not 0 <= value <= 1:
        raise Unscorable(f"{metric} = {value:g} is not a fraction in [0, 1]; the score needs one")
    return float(value)


def fps_value(record: dict[str, Any]) -> float | None:
    """eval.json's headline FPS (a number or {"fps": ...}), or None when absent or not a positive number."""
    fps = record.get("fps")
    if isinstance(fps, dict):
        fps = fps.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
        return None
    return float(fps)


def fps_base(rule: ScoreRule, fps_values: list[float]) -> float | None:
    """The FPS that maps to 1.0: the target, else the best of the fleet (None if nobody has FPS)."""
    if rule.fps_target is not None:
        return rule.fps_target
    return max(fps_values) if fps_values else None


def fps_norm(rule: ScoreRule, fps: float, base: float) -> float:
    """FPS normalised by the rule: fps / best, or min(1, fps / target)."""
    ratio = fps / base
    return min(1.0, ratio) if rule.fps_target is not None else ratio


def composite(rule: ScoreRule, quality: float, norm: float | None) -> float:
    """w_quality x quality + w_fps x fps_norm (the FPS term is 0 when its weight is)."""
    fps_term = 0.0 if rule.fps_weight == 0 else rule.fps_weight * (norm or 0.0)
    return rule.quality_weight * quality + fps_term
