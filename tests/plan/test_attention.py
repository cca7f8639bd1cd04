"""The fused attention kernel's rate against sequence length, checked against a published kernel sweep."""

import pytest

from musubi.plan.attention import FLASH_HALF_SEQ, flash_rate_fraction
from musubi.plan.catalog import get_gpu
from musubi.plan.efficiency import DEFAULT_EFFICIENCY

SEQS = (512, 1024, 2048, 4096, 8192, 16384)
#: pytorch/benchmark PR #2391 (H100, head dim 128, 16 heads, batch x seq = 16k tokens), TFLOP/s.
TRITON_FA2 = (328.882, 389.723, 433.721, 458.359, 470.732, 476.753)
FA3 = (430.32, 517.099, 565.544, 590.233, 614.234, 620.73)


@pytest.mark.parametrize("published", [TRITON_FA2, FA3], ids=["triton-fa2", "fa3"])
def test_rate_against_sequence_follows_the_published_sweep(published):
    # The curve's shape (rate at s over rate at 16k) is what the planner takes from the sweep; within 3 %.
    model_16k = flash_rate_fraction(1.0, 16384)
    for seq, tflops in zip(SEQS, published, strict=True):
        modelled = flash_rate_fraction(1.0, seq) / model_16k
        assert modelled == pytest.approx(tflops / published[-1], rel=0.03), seq


def test_rate_climbs_and_flattens():
    fractions = [flash_rate_fraction(0.5, s) for s in (256, 2048, 131072)]
    assert fractions[0] < fractions[1] < fractions[2] < 0.5
    assert flash_rate_fraction(0.5, FLASH_HALF_SEQ) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="seq"):
        flash_rate_fraction(0.5, 0)


def test_kernel_generations_from_their_papers():
    # FA2 paper abstract: FA1 25-40 % of A100 peak, FA2 50-73 %; FA3 paper: FA2 35 % of H100 peak.
    assert 0.25 <= DEFAULT_EFFICIENCY.flash1 <= 0.40
    assert DEFAULT_EFFICIENCY.flash == 0.5
    h100 = get_gpu("H100-SXM").achieved
    assert h100["flash"] == 0.35
    # Ampere-style kernels keep on Hopper the share FA2 keeps (no wgmma): 0.325 x 0.35 / 0.5.
    assert h100["flash1"] == pytest.approx(DEFAULT_EFFICIENCY.flash1 * h100["flash"] / DEFAULT_EFFICIENCY.flash)
