"""`grads=fp32`: gradients accumulated and reduced in fp32 (layout.GRADS), a stack fact the range spans.

Source: Megatron-LM before Core turned fp32 gradient accumulation and all-reduce on whenever bf16 was
(`arguments.py`: accumulate_allreduce_grads_in_fp32), and its distributed optimizer keeps fp32 main gradients
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
from musubi.plan.predict import predict
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
