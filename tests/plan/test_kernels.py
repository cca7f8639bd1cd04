"""`kernels=eager|fused`: how a stack writes the norms, RoPE and SwiGLU product, and ZeRO-2's reduce per micro-batch.

Eager bytes are counted op by op from Hugging Face transformers' Llama (models/llama/modeling_llama.py, commit
0022728: LlamaRMSNorm, rotate_half, apply_rotary_pos_emb, LlamaMLP); each PyTorch op reads its inputs from HBM and
writes its output. Unnamed, a layout is priced eager (layout.DEFAULT_KERNELS): the reference code, what DeepSpeed
and HF Trainer runs execute; a stack with fused kernels (Megatron-Core / Transformer Engine, XLA, nanotron) names
`kernels=fused`. The range spans both where the architecture has an RMSNorm, RoPE or SwiGLU.

ZeRO-2 keeps only its shard of the gradients, so it reduce-scatters after every backward, not once a step
(DeepSpeed's maintainers, deepspeedai/DeepSpeed#2252: "gradient reduction is required after every backward because
of gradient partitioning"); ZeRO-1 keeps full gradients and reduces once.
"""

from __future__ import annotations

import dataclasses

import pytest

from musubi.plan.catalog import get_gpu
from musubi.plan.cluster import make_cluster
from musubi.plan.complete import complete_layout, range_by_fact, stack_range
from musubi.plan.compute import (
    EAGER_LOSS_EXTRA,
    EAGER_RMSNORM_EXTRA,
    EAGER_ROPE_EXTRA,
    EAGER_SWIGLU_EXTRA,
    eager_extra_bytes,
    has_eager_work,
)
from musubi.plan.errors import PlanError
from musubi.plan.layout import given_keys, parse_layout
from musubi.plan.predict import predict
from musubi.plan.spec import TransformerSpec, preset

LLAMA8 = preset("llama3-8b")
GPT3 = preset("gpt3-175b")
#: LLaMA-7B (facebook/llama-7b): 32 x 4096, 32 heads, SwiGLU 11,008, vocab 32,000.
LLAMA7 = TransformerSpec(name="llama-7b", layers=32, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000,
                         seq=2048, mlp="swiglu")

#: (reads, writes) in bytes per element of each op transformers' code runs, bf16 in and out, fp32 inside the norm.
RMSNORM_OPS = {"to(float32)": (2, 4), "pow(2)": (4, 4), "mean(-1)": (4, 0), "x * rsqrt": (4, 4),
               "to(bf16)": (4, 2), "weight * x": (2, 2)}
#: per element of q (and of k): -x2 touches half the elements.
ROPE_OPS = {"q * cos": (2, 2), "-x2": (1, 1), "cat": (2, 2), "* sin": (2, 2), "+": (4, 2)}
SWIGLU_OPS = {"silu(gate)": (2, 2), "* up": (4, 2)}
#: LlamaForCausalLM's loss, per logit: logits.float(), the shift's .contiguous(), CrossEntropyLoss's log-softmax in fp32.
LOSS_OPS = {"float()": (2, 4), "contiguous()": (4, 4), "log_softmax": (4, 4)}
#: What the fused kernels the planner prices move (compute.py): read and write once; SwiGLU reads two, writes one;
#: the fused loss reads the bf16 logits, writes the fp32 softmax and reads it back.
FUSED = {"rmsnorm": 4, "rope": 4, "swiglu": 6, "loss": 10}


@pytest.mark.parametrize(("ops", "fused", "extra"), [(RMSNORM_OPS, FUSED["rmsnorm"], EAGER_RMSNORM_EXTRA),
                                                     (ROPE_OPS, FUSED["rope"], EAGER_ROPE_EXTRA),
                                                     (SWIGLU_OPS, FUSED["swiglu"], EAGER_SWIGLU_EXTRA),
                                                     (LOSS_OPS, FUSED["loss"], EAGER_LOSS_EXTRA)])
def test_the_extra_bytes_are_the_ops_of_the_reference_code(ops: dict[str, tuple[int, int]], fused: int,
                                                           extra: int) -> None:
    assert sum(r + w for r, w in ops.values()) == fused + extra


def test_extra_bytes_of_a_layer_by_architecture() -> None:
    """Two RMSNorms over h, RoPE over q and k, the SwiGLU product over the MLP width; nothing for GPT-3's
    LayerNorm, bias-GELU and learned positions."""
    h, kv, f = LLAMA8.hidden, LLAMA8.kv * LLAMA8.head_dim, LLAMA8.ffn
    assert eager_extra_bytes(LLAMA8, 1000, h, f, h + kv) == 1000 * (32 * 2 * h + 16 * (h + kv) + 4 * f)
    assert has_eager_work(LLAMA8) and not has_eager_work(GPT3)
    assert eager_extra_bytes(GPT3, 1000, GPT3.hidden, GPT3.ffn, 2 * GPT3.hidden) == 0


def test_the_eager_loss_adds_its_bytes_a_logit_and_only_on_llama_shapes() -> None:
    """Llama 3 8B (vocab 128,256) at micro-batch 1: the eager loss moves 12 more bytes a logit each way; GPT-3's
    loss (Megatron's fused cross-entropy) does not move."""
    from musubi.plan.compute import Device, logits_times
    dev = Device(flops=1e15, peak=1e15, hbm=1e12, gemm_memory=0.5, flash=0.5, flash1=0.3, flash3=0.5)
    layout = parse_layout("micro=1")
    eager_f, eager_b = logits_times(LLAMA8, layout, dev)
    fused_f, fused_b = logits_times(LLAMA8, dataclasses.replace(layout, kernels="fused"), dev)
    extra = 12 * LLAMA8.seq * LLAMA8.vocab / 1e12
    assert eager_f - fused_f == pytest.approx(extra) and eager_b - fused_b == pytest.approx(extra)
    assert logits_times(GPT3, layout, dev) == logits_times(GPT3, dataclasses.replace(layout, kernels="fused"), dev)


def test_the_key_parses_prints_and_defaults_to_eager() -> None:
    assert parse_layout("tp=2").kernels == "eager"
    fused = dataclasses.replace(parse_layout("tp=2,kernels=fused"), dp=4)
    assert fused.kernels == "fused" and "kernels=fused" in fused.text()
    assert "kernels" not in dataclasses.replace(parse_layout("tp=2"), dp=4).text()
    with pytest.raises(PlanError, match="kernels=triton: expected one of eager, fused"):
        parse_layout("kernels=triton")


def test_eager_kernels_slow_a_llama_step_and_leave_gpt3_alone() -> None:
    """LLaMA-7B on 8 A100 (the FlagPerf Paddle layout): the eager norms, RoPE and SwiGLU add 8-14 % to the step;
    GPT-3's step does not move."""
    cluster = make_cluster(get_gpu("A100-80GB"), 8)
    text = "dp=8,zero=2,micro=4,recompute=none"
    eager = predict(LLAMA7, cluster, parse_layout(text), 2048).step_time_s
    fused = predict(LLAMA7, cluster, parse_layout(text + ",kernels=fused"), 2048).step_time_s
    assert 1.08 < eager / fused < 1.14
    big = make_cluster(get_gpu("A100-80GB"), 64)
    gpt = "tp=8,pp=8,recompute=full,micro=1"
    assert predict(GPT3, big, parse_layout(gpt), 512).step_time_s == \
        predict(GPT3, big, parse_layout(gpt + ",kernels=fused"), 512).step_time_s


def test_the_fused_share_stays_under_a_published_kernel_library_s_end_to_end_gain() -> None:
    """Liger-Kernel's README: +20 % throughput from its fused RMSNorm, RoPE, SwiGLU and linear cross-entropy over
    the Hugging Face Llama 3 8B, FSDP on 8 A100 with activation checkpointing. Its fused linear cross-entropy never
    writes the logits, which the planner's fused loss still reads and writes, so the planner's gain at that setting
    must stay below it, and be a real share of it."""
    cluster = make_cluster(get_gpu("A100-80GB"), 8)
    text = "dp=8,zero=3,recompute=full,micro=8"
    eager = predict(LLAMA8, cluster, parse_layout(text), 64).step_time_s
    fused = predict(LLAMA8, cluster, parse_layout(text + ",kernels=fused"), 64).step_time_s
    assert 1.05 < eager / fused < 1.20


def test_the_range_spans_kernels_only_where_they_differ() -> None:
    cluster = make_cluster(get_gpu("A100-80GB"), 8)
    text = "dp=8,zero=2,micro=4,recompute=none"
    layout, _ = complete_layout(LLAMA7, cluster, parse_layout(text), given_keys(text), 2048)
    fast, slow, unknown = stack_range(LLAMA7, cluster, layout, given_keys(text), 2048)  # type: ignore[misc]
    assert "kernels" in unknown and "kernels=fused" in fast.layout and "kernels=fused" not in slow.layout
    by_fact = range_by_fact(LLAMA7, cluster, layout, given_keys(text), 2048)
    assert by_fact["kernels"][0] == "fused" and by_fact["kernels"][1] < 0.93
    named = text + ",kernels=fused"
    assert "kernels" not in range_by_fact(LLAMA7, cluster, parse_layout(named), given_keys(named), 2048)
    gpt = "tp=8,pp=8"
    big = make_cluster(get_gpu("A100-80GB"), 1024)
    gpt_layout, _ = complete_layout(GPT3, big, parse_layout(gpt), given_keys(gpt), 2048)
    assert "kernels" not in stack_range(GPT3, big, gpt_layout, given_keys(gpt), 2048)[2]  # type: ignore[index]


@pytest.mark.parametrize("gpus", [8, 32])
def test_zero2_reduce_scatters_every_micro_batch_and_zero1_once(gpus: int) -> None:
    """At m micro-batches a step, ZeRO-2 sends m reduce-scatters' bytes and one all-gather's; ZeRO-1 one of each;
    with one micro-batch they are the same."""
    cluster = make_cluster(get_gpu("A100-80GB"), gpus)
    batch = gpus * 4 * 16  # micro 4, 16 micro-batches
    z1 = predict(LLAMA7, cluster, parse_layout("zero=1,micro=4,kernels=fused"), batch).data_parallel
    z2 = predict(LLAMA7, cluster, parse_layout("zero=2,micro=4,kernels=fused"), batch).data_parallel
    assert z1 is not None and z2 is not None
    assert z2.bytes_per_gpu == pytest.approx(z1.bytes_per_gpu * (16 + 1) / 2)  # bf16 weights = bf16 gradients
    assert z2.busy_s > 8 * z1.busy_s
    one = gpus * 4
    z1_one = predict(LLAMA7, cluster, parse_layout("zero=1,micro=4"), one).data_parallel
    z2_one = predict(LLAMA7, cluster, parse_layout("zero=2,micro=4"), one).data_parallel
    assert z1_one is not None and z2_one is not None
    assert z2_one.bytes_per_gpu == pytest.approx(z1_one.bytes_per_gpu)
