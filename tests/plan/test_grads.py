"""`grads=fp32` and `bucket_mb=N`: the data-parallel stack facts a printed layout leaves out.

`grads=fp32`: gradients accumulated and reduced in fp32 (layout.GRADS), a stack fact the range spans.

Source: Megatron-LM's training scripts turn fp32 gradient accumulation and all-reduce on whenever bf16 is on
(`megatron/training/arguments.py`: accumulate_allreduce_grads_in_fp32; newer versions opt out with --grad-reduce-in-bf16), and its distributed optimizer keeps fp32 main gradients
(its `distrib_optimizer.md` table: 6 + 12/d bytes a parameter, the `mixed-fp32-grads` accounting). The
reduce-scatter (all-reduce without ZeRO) moves 4 bytes a gradient instead of 2; the parameter all-gather still
moves bf16 weights.
"""

from __future__ import annotations

import dataclasses

import pytest

from musubi.plan.catalog import get_gpu
from musubi.plan.cluster import make_cluster
from musubi.plan.complete import complete_layout, stack_range
from musubi.plan.errors import PlanError
from musubi.plan.layout import given_keys, parse_layout
from musubi.plan.memory import estimate_memory_gib
from musubi.plan.predict import gradient_buckets, megatron_bucket_bytes, predict
from musubi.plan.spec import TransformerSpec, preset

LLAMA8 = preset("llama3-8b")
#: LLaMA-13B as Megatron-LLaMA trained it (its README_zh: 40 layers, hidden 5120, 40 heads, SwiGLU 13824).
LLAMA13 = TransformerSpec(name="llama-13b", layers=40, hidden=5120, heads=40, ffn_hidden=13824, vocab=32000,
                          seq=2048, mlp="swiglu")


def test_the_key_parses_prints_and_refuses_a_bad_dtype() -> None:
    layout = parse_layout("tp=2,zero=1,grads=fp32")
    assert layout.grads == "fp32" and "grads=fp32" in dataclasses.replace(layout, dp=4).text()
    assert "grads" not in dataclasses.replace(parse_layout("tp=2"), dp=4).text()
    with pytest.raises(PlanError, match="grads=fp16: expected one of bf16, fp32"):
        parse_layout("grads=fp16")


@pytest.mark.parametrize(("zero", "ratio"), [(0, 2.0), (1, 1.5)])
def test_fp32_gradients_double_the_reduced_bytes_and_not_the_gathered(zero: int, ratio: float) -> None:
    """ZeRO-0: the all-reduce moves fp32 gradients, 2x the bytes; ZeRO-1: the reduce-scatter doubles and the bf16
    parameter all-gather does not, 1.5x."""
    cluster = make_cluster(get_gpu("A100-80GB"), 64)
    text = f"tp=2,zero={zero},micro=1,recompute=full"
    bf16 = predict(LLAMA8, cluster, parse_layout(text), 64).data_parallel
    fp32 = predict(LLAMA8, cluster, parse_layout(text + ",grads=fp32"), 64).data_parallel
    assert bf16 is not None and fp32 is not None
    assert fp32.bytes_per_gpu == pytest.approx(ratio * bf16.bytes_per_gpu)
    assert fp32.busy_s > bf16.busy_s


def test_fp32_gradients_hold_two_more_bytes_a_local_parameter() -> None:
    layout = dataclasses.replace(parse_layout("tp=2,zero=1,micro=1"), dp=32)
    grown = estimate_memory_gib(LLAMA8, dataclasses.replace(layout, grads="fp32"), 32) \
        - estimate_memory_gib(LLAMA8, layout, 32)
    params = LLAMA8.params() / 2  # tp 2, no pipeline: every layer on this GPU
    assert grown == pytest.approx(2 * params / 2**30, rel=0.02)


def test_the_range_spans_the_gradient_dtype_only_where_gradients_are_reduced() -> None:
    cluster = make_cluster(get_gpu("A100-80GB"), 64)
    for text, expect in (("tp=8,zero=1", True), ("tp=8,zero=1,grads=bf16", False), ("tp=8,pp=8", False)):
        layout, _ = complete_layout(LLAMA8, cluster, parse_layout(text), given_keys(text), 64)
        result = stack_range(LLAMA8, cluster, layout, given_keys(text), 64)
        assert result is not None and ("grads" in result[2]) is expect, text


def test_named_stack_facts_give_megatron_llamas_distributed_optimizer_slope() -> None:
    """Megatron-LLaMA's README (third blind set, seen since its scoring): LLaMA-13B, TP 2, a 2048-sequence batch,
    Megatron-LM's 2023 DistributedOptimizer (which its README says does not overlap its collectives), 8 A100 a
    node with 4 x 200 Gb/s (12.5 GB/s a GPU): 1,630 -> 1,430 tokens/s a GPU from 256 to 512 GPUs (-12.3 %). From
    the printed layout the planner gives -1.4 %; with the stack's and the cluster's facts named (no overlap, fp32
    gradients, the cluster's NIC) the same terms give -12.7 %: the reduce-scatter of 26 GB of fp32 gradients and
    the gather of 13 GB of weights (1.05 s at 40 GB/s a rank) stop hiding, and at a fixed batch they are a
    constant while the compute halves. Nothing here is fitted; the level (+31 %) is not explained."""
    gpu = dataclasses.replace(get_gpu("A100-80GB"), nic_gbps=12.5)
    text = "tp=2,zero=1,micro=8,recompute=none,overlap=none,grads=fp32"
    rate = {n: predict(LLAMA13, make_cluster(gpu, n), parse_layout(text), 2048).tokens_per_s / n for n in (256, 512)}
    predicted = rate[512] / rate[256] - 1
    assert predicted == pytest.approx(1430 / 1630 - 1, abs=0.02)
    bf16 = {n: predict(LLAMA13, make_cluster(gpu, n), parse_layout(text.replace(",grads=fp32", "")), 2048)
            for n in (256, 512)}
    assert bf16[512].tokens_per_s / bf16[256].tokens_per_s / 2 - 1 > predicted + 0.02  # fp32 carries part of it


def test_bucket_mb_sets_how_many_collectives_a_step_pays_latency_for() -> None:
    """`bucket_mb=100` (Apex DistributedFusedAdam's bucket_cap_mb): 10 GB of gradients are 96 collectives however
    large the group, where Megatron-Core's max(40M, 1M x dp) parameters make 20 at 256 ranks; each pays its ring's
    latency, so at 32 nodes the fixed buckets cost more."""
    nbytes = 5e9 * 2
    assert gradient_buckets(nbytes, 256, 2.0, megatron_bucket_bytes) == 20
    layout = parse_layout("dp=256,zero=1,micro=2,bucket_mb=100")
    assert layout.bucket_mb == 100 and "bucket_mb=100" in dataclasses.replace(layout, dp=256).text()
    with pytest.raises(PlanError, match="bucket_mb=-1: must be >= 0"):
        parse_layout("bucket_mb=-1")
    cluster = make_cluster(get_gpu("A100-80GB"), 256)
    fixed = predict(NEMO_5B, cluster, layout, 2048).data_parallel
    default = predict(NEMO_5B, cluster, parse_layout("dp=256,zero=1,micro=2"), 2048).data_parallel
    assert fixed is not None and default is not None
    assert fixed.bytes_per_gpu == pytest.approx(default.bytes_per_gpu) and fixed.busy_s > 1.3 * default.busy_s


#: GPT 5B as the NeMo launcher's conf/training/gpt3/5b.yaml trains it (second blind set, seen since its scoring).
NEMO_5B = TransformerSpec(name="gpt-5b", layers=24, hidden=4096, heads=32, vocab=50304, seq=2048, mlp="gelu",
                          bias=True, norm="layernorm", learned_positions=True, tied_embeddings=True, dropout=True)


def test_named_stack_facts_give_the_nemo_launchers_slope() -> None:
    """NeMo launcher GPT 5B (2022), 8 -> 256 A100 at a fixed 2,048-sequence batch: 5,043 -> 4,529 tokens/s a GPU
    (-10.2 %); from the printed layout the planner gives -2.6 %. NeMo's distributed optimizer (Apex
    DistributedFusedAdam) defaults, as NeMo's own docs table them (docs/source/features/parallelisms.rst:
    grad_sync_dtype = dtype = fp32, overlap_grad_sync True, overlap_param_sync False, bucket_cap_mb 100), named:
    -9.2 %. The updated weights' all-gather runs after the step in 100 MB pieces, each a ring of 255 hops at 32
    nodes, a constant 0.12 s while the compute shrinks 32x. Nothing fitted; the level (+30 %) is not explained."""
    text = "dp={n},zero=1,micro=2,recompute=none,overlap=dp,pp,cp,grads=fp32,bucket_mb=100"
    rate = {n: predict(NEMO_5B, make_cluster(get_gpu("A100-80GB"), n), parse_layout(text.format(n=n)),
                       2048).tokens_per_s / n for n in (8, 256)}
    assert rate[256] / rate[8] - 1 == pytest.approx(4528.5 / 5043.1 - 1, abs=0.02)
