"""Checkpoint cadence from the fault rate and the save cost: Young's and Daly's optimum interval.

A job that saves every tau seconds of work pays delta (the time a save blocks the step) per save and,
at each fault, redoes on average half an interval of work. With faults at mean interval M (the mean
time between failures), the waste per unit of work is about delta / tau + tau / (2 M), least at

    tau = sqrt(2 delta M)                                  (Young 1974)

Daly (2006) keeps the next terms of the expansion, for saves that are not small beside M:

    tau = sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + delta / 18M) - delta   for delta < 2M, else M.

Asynchronous saves (the step waits only for the copy to host memory) make delta small, so the
optimum is short: bench/soak.py prints it from a soak's measured delta and M.
"""

from __future__ import annotations

import math


def young_daly_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Daly's optimum seconds of work between checkpoints for a save cost and a mean time between faults."""
    if save_cost_s < 0 or mtbf_s <= 0:
        raise ValueError(f"save cost {save_cost_s} s must be >= 0 and the mean time between faults {mtbf_s} s > 0")
    if save_cost_s >= 2 * mtbf_s:
        return mtbf_s
    r = save_cost_s / (2 * mtbf_s)
    return math.sqrt(2 * save_cost_s * mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - save_cost_s


def expected_waste(interval_s: float, save_cost_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """First-order share of wall time lost to saves, redone work and restarts at this interval."""
    if interval_s <= 0 or mtbf_s <= 0:
        raise ValueError("interval and mean time between faults must be > 0")
    return min(1.0, save_cost_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s)
