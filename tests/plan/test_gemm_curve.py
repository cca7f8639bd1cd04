"""The GEMM term against a published GEMM table (not a training run).

XLA ships measured matmul throughput per GPU generation as its default cost table:
tensorflow/tensorflow@372d578bb861cc5804e56d37d93aec931a59762c,
third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h, key "sm_90" (Hopper, H100),
"bf16xbf16->bf16" FLOP/s for batched [m x k] @ [k x n]. Below: 25 of its larger shapes (one side 4096,
or square at 2048; the small ones measure launch overhead, which the planner does not model), TFLOP/s.
"""

from __future__ import annotations

import pytest

from musubi.plan.catalog import get_gpu
from musubi.plan.cluster import make_cluster
from musubi.plan.compute import device, gemm_s
from musubi.plan.efficiency import DEFAULT_EFFICIENCY

# (batch, m, n, k, measured TFLOP/s)
XLA_SM90_BF16 = [
    (1, 4096, 4096, 4096, 783.3), (2, 4096, 4096, 4096, 807.7), (4, 4096, 4096, 4096, 793.1),
    (2, 4096, 2048, 4096, 783.2), (4, 4096, 2048, 4096, 808.7), (4, 4096, 1024, 4096, 777.6),
    (2, 4096, 1024, 4096, 750.6), (1, 4096, 1024, 4096, 738.5), (1, 4096, 4096, 2048, 738.7),
    (2, 4096, 4096, 2048, 763.0), (4, 2048, 2048, 2048, 725.7), (1, 2048, 2048, 2048, 632.0),
    (2, 2048, 4096, 1024, 678.7), (1, 4096, 512, 4096, 650.0), (2, 4096, 512, 4096, 729.7),
    (4, 4096, 512, 4096, 728.6), (1, 256, 4096, 4096, 412.0), (1, 4096, 4096, 512, 543.1),
    (1, 4096, 4096, 256, 392.2), (2, 4096, 4096, 256, 464.0), (4, 4096, 4096, 256, 503.9),
    (4, 4096, 4096, 512, 619.9), (1, 4096, 2048, 512, 447.0), (1, 2048, 4096, 1024, 594.2),
    (1, 1024, 4096, 1024, 490.3),
]


def _ours_tflops(b: int, m: int, n: int, k: int) -> float:
    dev = device(make_cluster(get_gpu("H100-SXM"), 8), DEFAULT_EFFICIENCY, "bf16")
    return 2 * m * n * k * b / gemm_s(dev, m, k, n, b) / 1e12


@pytest.mark.parametrize(("b", "m", "n", "k", "measured"), XLA_SM90_BF16)
def test_h100_gemm_rate_is_within_a_third_of_xla_table(b: int, m: int, n: int, k: int, measured: float) -> None:
    assert -0.35 <= _ours_tflops(b, m, n, k) / measured - 1 <= 0.2


def test_h100_gemm_term_is_conservative_so_the_h100_training_gap_is_elsewhere() -> None:
    """On shapes with every side >= 1024 the model is 18 % under XLA's measured rates (2026-11-28): it gives H100
    GEMMs less speed than measured, never more. So the H100 training rows it over-predicts (MPT, +15-40 %) are not
    explained by GEMM efficiency against shape (docs/guides/planner-published-runs.md)."""
    big = [_ours_tflops(b, m, n, k) / t - 1 for b, m, n, k, t in XLA_SM90_BF16 if min(m, n, k) >= 1024]
    mean = sum(big) / len(big)
    assert -0.25 <= mean <= 0.0, mean
