"""Pipeline bubble and in-flight micro-batches of 1F1B, interleaved and zero-bubble schedules."""

from __future__ import annotations

import pytest

from musubi.plan.bubble import bubble_fraction, in_flight_factor


def test_bubble_formulas() -> None:
    assert bubble_fraction("1f1b", 1, 8) == 0.0
    assert bubble_fraction("1f1b", 8, 64) == pytest.approx(7 / 64)  # (p - 1) / m
    assert bubble_fraction("interleaved", 8, 64, vpp=3) == pytest.approx(7 / (3 * 64))  # (p - 1) / (v m)
    assert bubble_fraction("zb", 8, 64) == pytest.approx(7 / (3 * 64))  # ZB-H1: a third of 1F1B
    assert bubble_fraction("1f1b", 64, 512) == pytest.approx(63 / 512)
    with pytest.raises(ValueError):
        bubble_fraction("gpipe-ish", 4, 8)


def test_in_flight_activations() -> None:
    assert in_flight_factor("1f1b", 1) == 1.0
    assert in_flight_factor("1f1b", 8, micro_batches=64) == 1.0  # p micro-batches of L/p layers
    assert in_flight_factor("1f1b", 8, micro_batches=2) == pytest.approx(2 / 8)  # fewer than p in flight
    assert in_flight_factor("interleaved", 8, vpp=4, micro_batches=64) == pytest.approx(1 + 7 / 32)
    assert in_flight_factor("zb", 8, micro_batches=64) == 1.0
