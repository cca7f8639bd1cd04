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


def test_the_planner_gemm_on_the_measured_h200_layer_shapes() -> None:
    """Measured on the lent H200 (bench/gemm_shapes.py, 2026-11-28, commit 86f0d45, torch 2.11 cuBLAS, bf16): the
    forward GEMMs of GPT-3 175B (TP 8), Llama 3 70B (TP 4, 8), Llama 3 8B and Nemotron-4 15B (TP 4) at 2k-16k tokens
    a micro-batch and three squares, 83 shapes. The planner (H200 catalog: matmul 0.71 + the operand roofline) is
    within -9 % and +4 % of every one, 2.8 % mean |error|, slightly under on average; and an 8192^3 GEMM run back to
    back for 60 s held 668-678 TFLOP/s at ~1500 MHz and ~687 W, the short benchmarks' rate: a sustained training
    load does not throttle Hopper below the figure the planner uses."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "results" / "gemm-shapes-2026-11-28-1xH200-86f0d45.json"
    data = json.loads(path.read_text())
    dev = device(make_cluster(get_gpu("H200"), 8), DEFAULT_EFFICIENCY, "bf16")
    errors = []
    for row in data["gemms"]:
        ours = 2 * row["m"] * row["k"] * row["n"] / gemm_s(dev, row["m"], row["k"], row["n"]) / 1e12
        errors.append(ours / row["measured_tflops"] - 1)
    assert len(errors) == 83 and -0.09 <= min(errors) and max(errors) <= 0.04
    assert -0.04 <= sum(errors) / len(errors) <= 0.0
    sustained = [w["tflops"] for w in data["sustained"]]
    assert len(sustained) >= 25 and max(sustained) / min(sustained) < 1.02
    square = next(r for r in data["gemms"] if r["op"] == "8192^3")["measured_tflops"]
    assert abs(sum(sustained) / len(sustained) / square - 1) < 0.02


def test_thin_k_gemms_are_priced_no_slower_than_xla_measures_them_against_its_large_shapes() -> None:
    """The smallest blind-set models are predicted too slow, but not by the GEMM roofline: on the table's shapes
    with a thin inner dimension (k <= 1024, m and n >= 2048) the planner's rate over its own 4096^3 rate is at least
    XLA's measured rate over XLA's 4096^3 rates, so the roofline does not penalise thin GEMMs more than the H100 does
    (the level is the catalog's `matmul`, checked on the lent H200 above; the figures are in
    docs/guides/planner-published-runs.md, planner9's section)."""
    large_ours = _ours_tflops(1, 4096, 4096, 4096)
    large_xla = sum(t for b, m, n, k, t in XLA_SM90_BF16 if min(m, n, k) == 4096) / 3
    thin = [(b, m, n, k, t) for b, m, n, k, t in XLA_SM90_BF16 if k <= 1024 and min(m, n) >= 2048]
    assert len(thin) == 8
    for b, m, n, k, t in thin:
        assert _ours_tflops(b, m, n, k) / large_ours >= t / large_xla, (b, m, n, k)
