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
from dataclasses import dataclass


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


# -- the rule of `checkpoint.every_steps: auto` -------------------------------------------------------

#: The prior failure rate, from Llama 3's pre-training ("The Llama 3 Herd of Models", Meta 2024, §3.3.4 and
#: Table 5): 419 unexpected interruptions in a 54-day snapshot on 16,384 H100 GPUs, one per 1.82e8
#: GPU-seconds (about 5.8 GPU-years). A job of G GPUs meets one every 1.82e8 / G seconds; CPU ranks count as GPUs.
LLAMA3_GPU_SECONDS_PER_FAULT = 54 * 86_400 * 16_384 / 419


#: First guess of a save's cost before one is measured: the state copied at this many bytes per second (a host copy
#: plus the writer's serialisation competing with training), or one step where that is longer.
FIRST_GUESS_BYTES_PER_S = 1e9
FIRST_GUESS = "the larger of one step and the state at 1 GB/s"


def prior_mtbf(gpus: int) -> float:
    """The mean seconds between faults of a job on `gpus` GPUs at Llama 3's published failure rate."""
    return LLAMA3_GPU_SECONDS_PER_FAULT / max(1, gpus)


def job_mtbf(prior_s: float, exposure_s: float, faults: int) -> tuple[float, str]:
    """The job's mean time between faults and where it comes from.

    With at least one fault in the job's own history: the seconds its attempts ran over the faults that ended
    them (measured). Without one: the prior, or the time the job has survived so far where that is longer.
    """
    if faults > 0 and exposure_s > 0:
        return exposure_s / faults, f"measured: {faults} fault(s) in {exposure_s:.0f} s of this job's attempts"
    if exposure_s > prior_s:
        return exposure_s, f"no fault in {exposure_s:.0f} s of this job's attempts (longer than the prior)"
    return prior_s, "prior"


@dataclass(frozen=True)
class CadenceChoice:
    """An interval in optimizer steps and why: Daly's optimum, then the bounds."""

    every_steps: int
    optimum_s: float  # Daly's seconds of work between saves
    bound: str  # "" (the optimum), "durable" (a save must end first), "epoch" or "max_interval_s"

    @property
    def why(self) -> str:
        """The bound in words, empty at the optimum."""
        return {"durable": "raised to the time a save takes to become durable",
                "epoch": "lowered to one epoch", "max_interval_s": "lowered to checkpoint.max_interval_s"}.get(
                    self.bound, "")


def choose_every_steps(save_cost_s: float, mtbf_s: float, step_s: float, durable_s: float, max_interval_s: float,
                       epoch_steps: int | None) -> CadenceChoice:
    """Steps between checkpoints: Daly's optimum for this save cost and fault rate, in steps of `step_s` seconds.

    Never so often that a save starts before the previous one is durable (`durable_s`: the next save would wait for
    it), never less often than once an epoch (`epoch_steps`) and once `max_interval_s`.
    """
    if step_s <= 0:
        raise ValueError(f"step time {step_s} s must be > 0")
    tau = young_daly_interval(save_cost_s, mtbf_s)
    every, bound = max(1, round(tau / step_s)), ""
    most = max(1, math.floor(max_interval_s / step_s))
    if epoch_steps is not None and epoch_steps < most:
        most, most_bound = max(1, epoch_steps), "epoch"
    else:
        most_bound = "max_interval_s"
    if every > most:
        every, bound = most, most_bound
    least = max(1, math.ceil(durable_s / step_s))
    if every < least:  # the save in flight must end before the next one: this bound wins over the others
        every, bound = least, "durable"
    return CadenceChoice(every, round(tau, 3), bound)


def rule_line(mtbf_s: float, mtbf_from: str, gpus: int, max_interval_s: float, first_guess: str) -> str:
    """`checkpoint.every_steps: auto` in words, with its inputs (the dry run, plan.json)."""
    prior = f"prior: Llama 3's 419 faults in 54 days on 16,384 GPUs, for {gpus} rank(s)" if mtbf_from == "prior" \
        else mtbf_from
    return (f"every_steps auto: Daly's interval τ = √(2·δ·M) (+ higher terms) − δ, in steps; δ = the save's cost to "
            f"training (step blocked + slower steps while it writes), median of the last saves, {first_guess} before "
            f"the first; M = {mtbf_s:,.0f} s between faults ({prior}); at least until a save is durable, at most "
            f"an epoch or {max_interval_s:g} s")
