"""The checkpoint cadence rule (plan/cadence.py): Young's and Daly's optimum, the prior, the bounds in steps."""

from __future__ import annotations

import math

import pytest

from musubi.plan.cadence import (
    LLAMA3_GPU_SECONDS_PER_FAULT,
    choose_every_steps,
    job_mtbf,
    prior_mtbf,
    young_daly_interval,
)


def daly_exact_optimum(delta: float, mtbf: float) -> float:
    """The interval minimising Daly's (2006) exact expected run time, M e^(R/M) (e^((τ+δ)/M) - 1) T_s / τ, found
    numerically (golden section on the part that depends on τ): what the closed form estimates."""
    def cost(tau: float) -> float:
        return math.expm1((tau + delta) / mtbf) / tau

    lo, hi = 1e-9 * mtbf, 10 * mtbf
    g = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if cost(a) < cost(b) else (a, hi)
    return (lo + hi) / 2


def test_young_first_order_example() -> None:
    """Young (1974): τ = √(2δM). A 60 s save, a fault a day: about 54 minutes; Daly's terms shorten it by ~1 %."""
    young = math.sqrt(2 * 60 * 86_400)
    assert young == pytest.approx(3219.9, abs=0.1)
    daly = young_daly_interval(60, 86_400)
    assert 0.98 * young < daly < young  # the −δ term outweighs the small positive ones


@pytest.mark.parametrize("ratio", [1e-4, 1e-3, 1e-2, 0.1, 0.5])
def test_daly_estimate_matches_the_exact_models_optimum(ratio: float) -> None:
    """Daly's closed form against his exact model's numeric optimum: within 1 % over δ/M from 1e-4 to 0.5, and
    closer than Young's first order where the save is not small beside M."""
    mtbf = 3600.0
    est, exact = young_daly_interval(ratio * mtbf, mtbf), daly_exact_optimum(ratio * mtbf, mtbf)
    assert est == pytest.approx(exact, rel=1e-2), (ratio, est, exact)
    if ratio >= 1e-2:
        assert abs(est - exact) < abs(math.sqrt(2 * ratio * mtbf * mtbf) - exact)


def test_daly_saves_as_long_as_a_fault_interval_when_a_save_costs_two() -> None:
    """δ ≥ 2M: Daly's rule saves every M."""
    assert young_daly_interval(200, 100) == 100
    with pytest.raises(ValueError):
        young_daly_interval(1, 0)


def test_prior_is_llama3s_published_rate_per_gpu() -> None:
    """419 interruptions in 54 days on 16,384 GPUs: one every ~3.1 h for the whole cluster, 1.82e8 GPU-seconds."""
    assert LLAMA3_GPU_SECONDS_PER_FAULT == pytest.approx(1.824e8, rel=1e-3)
    assert prior_mtbf(16_384) / 3600 == pytest.approx(3.09, abs=0.01)
    assert prior_mtbf(8) == pytest.approx(LLAMA3_GPU_SECONDS_PER_FAULT / 8)
    assert prior_mtbf(0) == LLAMA3_GPU_SECONDS_PER_FAULT  # never a division by zero


def test_job_mtbf_measured_prior_or_survived() -> None:
    m, why = job_mtbf(1e6, 300.0, 5)
    assert m == 60.0 and why.startswith("measured: 5 fault(s) in 300 s")
    assert job_mtbf(1e6, 300.0, 0) == (1e6, "prior")
    m, why = job_mtbf(100.0, 300.0, 0)  # no fault in longer than the prior: at least that long
    assert m == 300.0 and "no fault" in why


def test_interval_in_steps_and_its_bounds() -> None:
    """Daly's seconds in steps; raised to the durable time of a save, lowered to an epoch or max_interval_s."""
    tau = young_daly_interval(0.3, 60.0)
    c = choose_every_steps(0.3, 60.0, 0.05, 1.0, 1800.0, 1000)
    assert (c.every_steps, c.bound, c.why) == (round(tau / 0.05), "", "") and c.optimum_s == pytest.approx(tau, 1e-3)
    c = choose_every_steps(0.3, 60.0, 0.05, 10.0, 1800.0, 1000)  # a save durable after 10 s: at least 200 steps
    assert (c.every_steps, c.bound) == (200, "durable") and "durable" in c.why
    c = choose_every_steps(0.3, 1e8, 0.05, 1.0, 1800.0, 256)  # the prior's rare faults: one epoch
    assert (c.every_steps, c.bound) == (256, "epoch")
    c = choose_every_steps(0.3, 1e8, 0.05, 1.0, 60.0, None)  # no epoch bound: max_interval_s
    assert (c.every_steps, c.bound) == (1200, "max_interval_s")
    c = choose_every_steps(0.3, 1e8, 0.05, 100.0, 60.0, 256)  # the durable bound wins: a save must end first
    assert (c.every_steps, c.bound) == (2000, "durable")
    with pytest.raises(ValueError):
        choose_every_steps(0.3, 60.0, 0.0, 1.0, 1800.0, None)
