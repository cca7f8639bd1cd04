"""Straggler tax: Blom's order statistic against the exact E[max of N normals] and the sqrt(2 ln N) bound."""

from __future__ import annotations

import math

import pytest

from musubi.plan.straggler import expected_max_z, sqrt_2_ln_n, straggler_tax


def exact_expected_max(n: int) -> float:
    """E[max of n standard normals] = integral of x n phi(x) Phi(x)^(n-1), by the trapezoid rule."""
    step, total = 1e-3, 0.0
    for i in range(-10_000, 10_001):
        x = i * step
        phi = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += x * n * phi * cdf ** (n - 1) * step
    return total


def test_blom_is_accurate_where_sqrt_2_ln_n_is_not() -> None:
    exact = exact_expected_max(8)
    assert exact == pytest.approx(1.4236, abs=1e-3)
    assert expected_max_z(8) == pytest.approx(exact, rel=0.01)
    assert sqrt_2_ln_n(8) / exact - 1 == pytest.approx(0.43, abs=0.01)  # 43 % high at N = 8


@pytest.mark.parametrize("n", [8, 64, 1024])
def test_blom_within_one_percent_from_eight_ranks(n: int) -> None:
    assert expected_max_z(n) == pytest.approx(exact_expected_max(n), rel=0.01)


def test_blom_small_n() -> None:
    assert expected_max_z(1) == 0.0
    assert expected_max_z(2) == pytest.approx(1 / math.sqrt(math.pi), rel=0.05)  # exact: 1/sqrt(pi)


def test_tax_scales_with_cv_and_grows_slowly_with_n() -> None:
    assert straggler_tax(0.0, 16384) == 0.0
    assert straggler_tax(0.02, 1) == 0.0
    assert straggler_tax(0.02, 8) == pytest.approx(2 * straggler_tax(0.01, 8))
    taxes = [straggler_tax(0.01, n) for n in (8, 64, 512, 4096, 32768)]
    assert taxes == sorted(taxes) and taxes[-1] < 0.05  # ~ sqrt(log N): 1 % CV costs < 5 % at 32k ranks
    with pytest.raises(ValueError):
        straggler_tax(-0.1, 8)
