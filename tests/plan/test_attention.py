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


#: Measured on the lent H200 (bench/gemm_shapes.py, 2026-11-28, commit 86f0d45, torch 2.11 SDPA flash backend,
#: causal, head dim 128, 16 heads, batch x seq = 16k): forward and forward + backward TFLOP/s (backward = 2.5x the
#: forward's FLOPs), from bench/results/gemm-shapes-2026-11-28-1xH200-86f0d45.json.
H200_FA2_FWD = (184.205, 241.456, 279.288, 301.849, 314.262, 320.803)
H200_FA2_FWD_BWD = (114.102, 168.831, 218.987, 258.001, 284.012, 312.082)


def test_backward_climbs_more_slowly_as_measured_on_h200():
    """The backward's rate over the forward's at each length, modelled (s + 230) / (s + 230 + 800), against the
    measured ratio: within 12 % at every length, and both rise to ~1 by 16k."""
    from musubi.plan.attention import flash_bwd_rate_fraction

    for seq, fwd, both in zip(SEQS, H200_FA2_FWD, H200_FA2_FWD_BWD, strict=True):
        bwd = 2.5 / (3.5 / both - 1 / fwd)  # the backward's own rate from the two timings
        modelled = flash_bwd_rate_fraction(1.0, seq) / flash_rate_fraction(1.0, seq)
        assert modelled == pytest.approx(bwd / fwd, rel=0.12), seq
    assert flash_bwd_rate_fraction(0.35, 512) < 0.5 * flash_rate_fraction(0.35, 512)
    # the plateau the catalog gives Hopper's FA2 (0.35 of peak, FA3 paper) is what the H200 reaches at 16k
    assert H200_FA2_FWD[-1] / 989.5 == pytest.approx(get_gpu("H200").achieved["flash"], rel=0.1)


#: The cuDNN backend of the same sweep (FA3-class on Hopper): forward TFLOP/s at seq 512 .. 16k.
H200_CUDNN_FWD = (316.8, 406.1, 474.9, 517.9, 551.7, 569.7)


def test_flash3_is_the_measured_hopper_kernel_and_fa2_elsewhere():
    """`attention=flash3` (FlashAttention-3 / cuDNN fused attention, what Transformer Engine runs) on Hopper reaches
    the measured cuDNN rate at 16k within 2 %; on A100 no such kernel exists, so it gets FA2's share."""
    from musubi.plan import make_cluster
    from musubi.plan.compute import device

    h200 = device(make_cluster(get_gpu("H200"), 8), DEFAULT_EFFICIENCY, "bf16")
    assert h200.flash3 * flash_rate_fraction(1.0, 16384) * 989.5 == pytest.approx(H200_CUDNN_FWD[-1], rel=0.02)
    assert h200.flash3 > 1.6 * h200.flash  # 0.58 vs 0.35 of peak: why NeMo (TE) rows sit low at attention=flash
    a100 = device(make_cluster(get_gpu("A100-80GB"), 8), DEFAULT_EFFICIENCY, "bf16")
    assert a100.flash3 == a100.flash
    assert get_gpu("H100-SXM").achieved["flash3"] == get_gpu("H200").achieved["flash3"]


def test_flash3_is_in_the_range_of_what_a_layout_leaves_unsaid():
    from musubi.plan.complete import STACK_ALTERNATIVES

    assert "flash3" in STACK_ALTERNATIVES["attention"]
