"""The composite score: w_quality x quality + w_fps x FPS_norm, with the FPS normalisation stated.

quality is the task's headline metric, a fraction in [0, 1] where higher is
better: mAP50 for detection, top-1 accuracy for classification, next-token
accuracy (val_acc) for language models, the job's primary_metric otherwise.
FPS_norm is FPS / the best FPS among the ranked jobs (default), or
min(1, FPS / target) when a target FPS is configured (meeting it earns full
credit: a model faster than needed gains nothing more).

Two quality floors keep speed from winning alone. The absolute one: a job is ranked
only when its quality reaches the floor of its metric (mAP50 >= 0.05, mAP50-95 >= 0.02;
top-1 a tenth of the way from chance, 1/classes, to perfect: 0.19 with 10 classes; top-5
alike from 5/classes; `leaderboard.min_quality` sets any metric's, and a metric without
one only needs to be above 0): a model with mAP50 0.00028 ranked first of a fleet where
every model was as poor, because 99.9 % of its score was speed. The relative one: at least
`quality_floor` x the best quality of the jobs measured by the same metric. The others
are listed, unranked, with the reason, and their FPS does not set the FPS normalisation.
Jobs of different metrics are ranked in separate tables (a top-1 and an mAP50 are not
one scale), each with its own FPS normalisation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from musubi.contract.errors import ConfigError

#: The quality metric by built-in task (user tasks: their primary_metric).
QUALITY_BY_TASK = {"detection": "map50", "classification": "top1", "lm": "val_acc"}
DEFAULT_WEIGHTS = (0.7, 0.3)
#: Share of the best quality (same metric) a job needs to be ranked: half as good as the best, and above 0.
DEFAULT_QUALITY_FLOOR = 0.5
#: Headline metrics, in the order they are picked when a job names no primary_metric.
KNOWN_PRIMARY = ("map50", "top1", "val_acc")
#: Absolute quality floors by metric (leaderboard.min_quality overrides or adds): below, never ranked.
DEFAULT_MIN_QUALITY: dict[str, float] = {"map50": 0.05, "map": 0.02}
#: Accuracies judged against chance: metric -> how many guesses count (chance = that / classes).
CHANCE_GUESSES = {"top1": 1, "top5": 5}
#: An accuracy's floor: this share of the way from chance to perfect (10 classes: top1 >= 0.19).
CHANCE_MARGIN = 0.1


class Unscorable(Exception):
    """A job that cannot be scored; str() is the reason shown in the leaderboard."""


@dataclass(frozen=True)
class ScoreRule:
    """Weights of quality and normalised FPS, and the FPS target (None: the fleet's best)."""

    quality_weight: float = DEFAULT_WEIGHTS[0]
    fps_weight: float = DEFAULT_WEIGHTS[1]
    fps_target: float | None = None
    quality_floor: float = DEFAULT_QUALITY_FLOOR
    #: Absolute floors by metric that replace or add to DEFAULT_MIN_QUALITY (and the chance rule).
    min_quality: Mapping[str, float] = field(default_factory=dict)

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
        for metric, value in self.min_quality.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ConfigError(f"leaderboard: min_quality {metric} {value!r}: must be a fraction in [0, 1] "
                                  f"(e.g. map50: {DEFAULT_MIN_QUALITY['map50']})")

    @property
    def floor_rule(self) -> str:
        """The quality floors in words."""
        floors = {**DEFAULT_MIN_QUALITY, **self.min_quality}
        named = ", ".join(f"{m} >= {v:g}" for m, v in floors.items() if m not in CHANCE_GUESSES)
        chance = ", ".join(f"{m} >= chance + {CHANCE_MARGIN:g} x (1 - chance), chance = {k}/classes"
                           for m, k in CHANCE_GUESSES.items() if m not in self.min_quality)
        mine = ", ".join(f"{m} >= {v:g}" for m, v in self.min_quality.items() if m in CHANCE_GUESSES)
        absolute = "; ".join(x for x in (named, chance, mine) if x)
        return (f"ranked when quality reaches its metric's absolute floor ({absolute}; other metrics: > 0) and "
                f">= {self.quality_floor:g} x the best quality of the same metric")

    def absolute_floor(self, metric: str, record: Mapping[str, Any]) -> tuple[float, str]:
        """The lowest quality of `metric` that may rank whatever the other jobs did, and where it comes from
        (leaderboard.min_quality, the default, or chance for `record`'s number of classes); (0, ...) where
        there is none (then quality must only be above 0)."""
        if metric in self.min_quality:
            return float(self.min_quality[metric]), "leaderboard.min_quality"
        if metric in DEFAULT_MIN_QUALITY:
            return DEFAULT_MIN_QUALITY[metric], "default; leaderboard.min_quality sets it"
        if metric in CHANCE_GUESSES:
            classes = class_count(record)
            if classes is None:
                return CHANCE_MARGIN, "default with the number of classes unknown; leaderboard.min_quality sets it"
            chance = min(1.0, CHANCE_GUESSES[metric] / classes)
            return (chance + CHANCE_MARGIN * (1 - chance),
                    f"chance {chance:.3g} ({CHANCE_GUESSES[metric]}/{classes} classes) + {CHANCE_MARGIN:g} x "
                    "(1 - chance); leaderboard.min_quality sets it")
        return 0.0, "none for this metric (quality must be above 0); leaderboard.min_quality sets one"

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


def class_count(record: Mapping[str, Any]) -> int | None:
    """The number of classes eval.json states ("classes": names, or "num_classes"), or None."""
    classes, count = record.get("classes"), record.get("num_classes")
    if isinstance(classes, list) and classes:
        return len(classes)
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        return count
    return None


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
