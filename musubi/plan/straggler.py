"""Straggler tax: a synchronous step waits for the slowest of N ranks.

If each rank's step time is normal with mean mu and coefficient of variation cv,
the step takes E[max of N] = mu (1 + cv * z_N), where z_N is the expected largest of
N standard normals. Blom's approximation z_N ~ Phi^-1((N - 0.375) / (N + 0.25)) is
within 1 % of the exact value for N >= 8 (2 % at N = 4, 4.5 % at N = 2); the popular
sqrt(2 ln N) bound is 43 % high at N = 8 (2.04 against 1.42).
"""

from __future__ import annotations

import math
from statistics import NormalDist

_BLOM_ALPHA = 0.375  # Blom 1958: plotting position (i - a) / (n - 2a + 1) with a = 3/8


def expected_max_z(n: int) -> float:
    """E[max of n standard normals] by Blom's approximation (0 for one rank)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n == 1:
        return 0.0
    return NormalDist().inv_cdf((n - _BLOM_ALPHA) / (n - 2 * _BLOM_ALPHA + 1))


def sqrt_2_ln_n(n: int) -> float:
    """The asymptotic bound sqrt(2 ln n), kept for comparison (too high for practical n)."""
    return math.sqrt(2 * math.log(n)) if n > 1 else 0.0


def straggler_tax(cv: float, n: int) -> float:
    """Fractional step-time increase, E[max]/mean - 1, for n ranks with per-rank step-time CV `cv`."""
    if cv < 0:
        raise ValueError(f"cv must be >= 0, got {cv}")
    return cv * expected_max_z(n)
