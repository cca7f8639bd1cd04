"""Did a job learn? Judged by its validation metric where it has one, by its training loss where not.

A training loss is a poor witness for some models: a two-stage detector's loss is summed over the RoIs it
samples, and those get harder as its proposals improve, so the loss climbs while the model gets better
(seen in a Faster R-CNN run whose mAP50 rose while its loss rose: BENCHMARKS.md, quality). The
validation metric is what the user ranks models by, so it decides. "Learned" means, in this order:

1. **Trajectory** (the primary metric at two or more validations, metrics.jsonl): the final validation
   is better than the first by at least MIN_GAIN (a score in [0, 1]: 0.01 absolute; a loss or
   perplexity: 1 % lower).
2. **Level** (where the metric's untrained value is known: 0 for mAP/mAR, chance = k/K for top-k of K
   classes): the final value has closed at least LEVEL_SHARE (10 %) of the way from the untrained value
   to a perfect 1.0, e.g. mAP50 >= 0.1 (an untrained detector scores ~0) or top1 >= 0.19 on 10 classes
   (chance 0.1). This judges a job validated
   once (at its end), and one that learned before its first validation and held.
3. **Loss** (no validation metric, or one of unknown untrained value at a single validation): rank 0's
   training loss, the mean of its last third of log records below the mean of its first third.

Where the metric speaks, it decides both ways: a metric that neither rose nor reached its level is "did not
learn" whatever the loss did.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

#: The least gain, first to final validation, that counts as learning: absolute for a score in [0, 1].
MIN_GAIN = 0.01
#: The same for a metric where lower is better (loss, perplexity): relative to the first validation.
MIN_REL_DROP = 0.01
#: The share of the way from an untrained model's score to a perfect 1.0 that a trained model must reach.
LEVEL_SHARE = 0.1

#: Scores whose untrained value is 0 (COCO mAP and mAR: an untrained detector finds nothing).
ZERO_START = ("map", "mar")


@dataclass(frozen=True)
class Verdict:
    """Whether a job learned, on what evidence, in one line."""

    learned: bool | None  # None: no evidence either way
    basis: str  # "metric" | "loss" | "none"
    found: str


def lower_is_better(metric: str) -> bool:
    """A loss, perplexity or error falls as a model learns; every other metric (accuracy, mAP) rises."""
    name = metric.lower()
    return any(word in name for word in ("loss", "ppl", "perplexity", "error"))


def untrained_level(metric: str, num_classes: int | None) -> float | None:
    """The score an untrained model gets (None: not known): 0 for mAP/mAR, k/K for top-k of K classes."""
    name = metric.lower()
    if name.startswith(ZERO_START):
        return 0.0
    if name.startswith("top") and name[3:].isdigit() and num_classes:
        return min(1.0, int(name[3:]) / num_classes)
    return None


def metric_values(val_records: list[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    """(step, value) of `metric` at each validation, in order; COCO's -1 (no ground truth) and non-finite
    values are not measurements."""
    out = []
    for r in val_records:
        v = r.get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            if v < 0 and not lower_is_better(metric):
                continue
            out.append((int(r.get("step") or 0), float(v)))
    return out


def judge_by_metric(metric: str, values: list[tuple[int, float]], num_classes: int | None) -> Verdict | None:
    """The verdict of the validation metric (trajectory, then level), or None where it cannot tell."""
    if not values:
        return None
    (first_step, first), (last_step, last) = values[0], values[-1]
    n = len(values)
    lower = lower_is_better(metric)
    where = (f"{metric} {first:.4g} at step {first_step} -> {last:.4g} at step {last_step} over {n} validations"
             if n > 1 else f"{metric} {last:.4g} at its only validation (step {last_step})")
    if n > 1:
        gain = (first - last) / abs(first) if lower and first else (last - first)
        if gain >= (MIN_REL_DROP if lower else MIN_GAIN):
            return Verdict(True, "metric", f"learned: {where}")
    base = None if lower else untrained_level(metric, num_classes)
    if base is not None:
        floor = base + LEVEL_SHARE * (1.0 - base)
        if last >= floor:
            return Verdict(True, "metric", f"learned: {where}, past {floor:.3g} (10 % of the way from an "
                                           f"untrained model's {base:.3g} to 1)")
        return Verdict(False, "metric", f"did not learn: {where}, below {floor:.3g} (10 % of the way from an "
                                        f"untrained model's {base:.3g} to 1)")
    if n > 1:
        return Verdict(False, "metric", f"did not learn: {where} (gain under "
                                        f"{f'{MIN_REL_DROP:.0%}' if lower else MIN_GAIN})")
    return None  # one validation of a metric whose untrained value is unknown: no trajectory, no level


def judge_by_loss(losses: list[float]) -> Verdict:
    """The verdict of rank 0's training loss: the mean of its last third below that of its first third."""
    if len(losses) < 2 or not all(math.isfinite(v) for v in losses):
        return Verdict(None, "none", f"{len(losses)} finite loss record(s) and no validation metric: too few "
                                     "to tell")
    third = max(1, len(losses) // 3)
    first, last = statistics.fmean(losses[:third]), statistics.fmean(losses[-third:])
    what = f"training loss {first:.4g} -> {last:.4g} (first third -> last third of rank 0's log)"
    return Verdict(last < first, "loss", ("learned: " if last < first else "did not learn: ") + what)


def judge(metric: str | None, val_records: list[dict[str, Any]], losses: list[float],
          num_classes: int | None = None) -> Verdict:
    """Whether a job learned: by `metric` at its validations where that can tell, else by its training loss."""
    if metric:
        verdict = judge_by_metric(metric, metric_values(val_records, metric), num_classes)
        if verdict is not None:
            return verdict
    verdict = judge_by_loss(losses)
    if metric and verdict.basis == "loss" and metric_values(val_records, metric):
        return Verdict(verdict.learned, "loss", f"{verdict.found}; {metric} at one validation only, its untrained "
                                                "value unknown")
    return verdict
