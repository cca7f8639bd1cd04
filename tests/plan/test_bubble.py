"""Pipeline bubble and in-flight micro-batches of 1F1B, interleaved and zero-bubble schedules."""

from __future__ import annotations

import pytest

from musubi.plan.bubble import bubble_fraction, held_layer_microbatches, in_flight_factor, warmup_forwards


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


def test_megatron_warmup_forwards() -> None:
    """megatron/core/pipeline_parallel/schedules.py: 1F1B p - r - 1; interleaved 2 (p - r - 1) + (v - 1) p."""
    assert warmup_forwards("1f1b", 8, 1, 0) == 7 and warmup_forwards("1f1b", 8, 1, 7) == 0
    assert warmup_forwards("interleaved", 16, 4, 0) == 2 * 15 + 3 * 16
    assert warmup_forwards("interleaved", 16, 4, 15) == 3 * 16
    assert warmup_forwards("zb", 8, 1, 2) == 5


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 2, 8), (8, 3, 24), (16, 4, 32), (8, 6, 64)])
def test_held_activations_match_korthikanti_closed_form(pp: int, vpp: int, m: int) -> None:
    """Even chunks: the walk of rank 0's order peaks at L (1 + (p - 1)/(p v)) layer-micro-batches
    (Korthikanti et al. 2022, sec. 4.2.3), with L = p v layers of one each."""
    layers = pp * vpp
    held = held_layer_microbatches("interleaved", pp, vpp, m, 0, [1.0] * vpp)
    assert held == pytest.approx(layers * (1 + (pp - 1) / (pp * vpp)))
    assert held == pytest.approx(layers * in_flight_factor("interleaved", pp, vpp, m))


def test_held_activations_1f1b_and_uneven_chunks() -> None:
    # 1F1B: rank r keeps p - r micro-batches of its layers (fewer when the step has fewer micro-batches)
    assert held_layer_microbatches("1f1b", 8, 1, 64, 0, [12]) == 8 * 12
    assert held_layer_microbatches("1f1b", 8, 1, 64, 7, [12]) == 12
    assert held_layer_microbatches("1f1b", 8, 1, 3, 0, [12]) == 3 * 12
    # Llama 3 405B, 16 stages x 4 chunks, first chunk one layer (it also holds the embedding): rank 0 runs
    # chunk 0 for 31 micro-batches, chunks 1-3 for 16 each before its first backward: 31 x 1 + 48 x 2
    assert held_layer_microbatches("interleaved", 16, 4, 32, 0, [1, 2, 2, 2]) == 31 + 96
    # the last rank under interleaving is not light: (v - 1) p + 1 chunk-micro-batches
    assert held_layer_microbatches("interleaved", 16, 4, 32, 15, [2, 2, 2, 2]) == 2 * (3 * 16 + 1)
    with pytest.raises(ValueError, match="chunk sizes"):
        held_layer_microbatches("interleaved", 16, 4, 32, 0, [8])
