"""A slow-rank drill judged against its machine's noise: what the healthy drill beside it measured.

On a loaded machine the host's noise can reach a 10 %-slow rank's excess, and the straggler detector then rightly
names no one (tests/diagnose/test_scenarios.py). These figures say whether that noise could have told such a rank
from the others, and whether the injected slowdown still shows against it.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from musubi.diagnose import drills
from musubi.diagnose.timeline import load_job
from musubi.telemetry.step_record import local_work_ms, wall_ms
from musubi.telemetry.straggler import WARMUP, WINDOW, median_low

#: One-sided z the slow run's leads must reach over the healthy run's (Mann-Whitney, normal approximation): 1 %.
#: Strict, as this replaces the detector's verdict; a real 10 % slowdown on a loaded 2-core machine gave a median
#: lead shift of 0.15 of a step.
SHIFT_Z = 2.326

#: How far above the bar the prediction from the healthy run's noise must be (a fraction of a step) for a 10 %-slow
#: rank to count as decidable on this machine now: the slow run's own noise is a fresh draw of the same machine.
MARGIN = 0.01


def leads(job_dir: Path, rank: int, factor: float = 1.0) -> list[float]:
    """Each steady step's local-work lead of `rank` over the other ranks' median, as a fraction of the step; with
    `factor`, as it would be with (factor - 1) x that rank's step of extra work added (the `slow` fault)."""
    out = []
    for _, recs in (x for x in load_job(job_dir).aligned() if x[0] > WARMUP):
        lead = local_work_ms(recs[rank]) - statistics.median(local_work_ms(r) for q, r in recs.items() if q != rank)
        pause = (factor - 1) * wall_ms(recs[rank])
        out.append((lead + pause) / (max(wall_ms(r) for r in recs.values()) + pause))
    return out


def predicted_low(healthy: Path, factor: float, rank: int) -> float:
    """What the detector's test would give a rank `factor` x slower on this machine now, predicted from a healthy
    run's own noise: the lowest, over every 20-step window, of the sign test's lower bound of the median lead."""
    fractions = leads(healthy, rank, factor)
    lows = [median_low(fractions[i:i + WINDOW]) for i in range(len(fractions) - WINDOW + 1)]
    return min((x for x in lows if x is not None), default=0.0)


def shift_z(a: list[float], b: list[float]) -> float:
    """How far the values of `a` lie above those of `b`: the Mann-Whitney U statistic as a one-sided z (normal
    approximation; 0 when either is empty)."""
    if not a or not b:
        return 0.0
    u = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)
    n, m = len(a), len(b)
    return (u - n * m / 2) / math.sqrt(n * m * (n + m + 1) / 12)


def slow_rank_against_noise(row: dict[str, Any], healthy: Path, slow: Path,
                            threshold: float) -> tuple[bool, dict[str, float]]:
    """A slow-rank drill the detector did not flag by the deadline: right only when this machine's measured noise
    (the healthy run beside it) could not tell a rank that much slower from the others, the injected slowdown still
    shows against that noise (its median lead over the healthy run's at least half of the fault's (factor - 1) /
    factor, and its leads above the healthy run's by a rank test at SHIFT_Z), and no other rank is named.
    Returns (right, the figures)."""
    sc = drills.SCENARIOS[row["scenario"]]
    factor = float(sc.inject(drills.CPU_STEP_MS).split("factor=")[1])
    predicted = predicted_low(healthy, factor, sc.rank)
    slow_leads, calm_leads = leads(slow, sc.rank), leads(healthy, sc.rank)
    shift = statistics.median(slow_leads) - statistics.median(calm_leads)
    z = shift_z(slow_leads, calm_leads)
    figures = {"predicted_low": round(predicted, 4), "bar": threshold, "lead_shift": round(shift, 4),
               "fault_share": round((factor - 1) / factor, 4), "shift_z": round(z, 2)}
    right = (predicted < threshold + MARGIN and shift >= 0.5 * (factor - 1) / factor and z >= SHIFT_Z
             and row["label"] in ("healthy compute bound", "straggler") and set(row["stragglers"]) <= {sc.rank}
             and {rank for rank, _ in row["live_flags"]} <= {sc.rank})
    return right, figures
