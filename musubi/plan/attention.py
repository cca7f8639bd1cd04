"""The fused attention kernel's rate against sequence length, for each kernel generation.

A fused (flash) kernel walks each query block over the key blocks; per query row it also pays
fixed work (loading the block, the softmax rescale, the epilogue, and on a causal mask the
diagonal block it computes whole but is credited half). That fixed work is amortised over the
keys, so the kernel's rate climbs with sequence length and flattens:

    rate(s) = plateau x s / (s + FLASH_HALF_SEQ)

`plateau` is the kernel's headline fraction of peak (Efficiency.flash / flash1, or the catalog's
per-GPU figure). FLASH_HALF_SEQ comes from a published sweep at a fixed number of tokens
(pytorch/benchmark PR #2391, H100, head dim 128, batch x seq = 16k, TFLOP/s for seq 512..16k:
Triton FA2 329, 390, 434, 458, 471, 477; FlashAttention-3 430, 517, 566, 590, 614, 621): both
kernels sit at 0.69 of their 16k rate at 512, 0.82-0.83 at 1k, 0.91 at 2k, 0.95-0.96 at 4k
(tests/plan/test_attention.py holds the check).

The backward kernel climbs more slowly: it pays per key block what the forward pays per query row
and more (dQ accumulation across key blocks, the recomputed scores, dK/dV written per block), so it
reaches half its plateau FLASH_BWD_EXTRA_SEQ keys later than the forward:

    backward rate(s) = plateau x s / (s + FLASH_HALF_SEQ + FLASH_BWD_EXTRA_SEQ)

measured on a lent H200 with bench/gemm_shapes.py (torch 2.11 SDPA flash backend = FA2, causal,
head dim 128, batch x seq = 16k; the figures and their date: BENCHMARKS.md, planner): the backward's
rate over the forward's rises from about half at seq 512 to ~1 at 16k; the constant is the median
excess of those points (tests/plan/test_attention.py holds them).
"""

from __future__ import annotations

#: Sequence length at which a fused attention kernel runs at half its plateau rate (tokens).
FLASH_HALF_SEQ = 230.0
#: How many more keys the backward kernel needs than the forward to reach half its plateau (measured, H200).
FLASH_BWD_EXTRA_SEQ = 800.0


def flash_rate_fraction(plateau: float, seq: float) -> float:
    """Fraction of dense peak a fused attention kernel reaches on keys of length `seq`."""
    if seq <= 0:
        raise ValueError(f"seq must be > 0, got {seq}")
    return plateau * seq / (seq + FLASH_HALF_SEQ)


def flash_bwd_rate_fraction(plateau: float, seq: float) -> float:
    """Fraction of dense peak a fused attention kernel's backward reaches on keys of length `seq`."""
    if seq <= 0:
        raise ValueError(f"seq must be > 0, got {seq}")
    return plateau * seq / (seq + FLASH_HALF_SEQ + FLASH_BWD_EXTRA_SEQ)
