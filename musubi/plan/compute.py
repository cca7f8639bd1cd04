"""Time of one micro-batch through one layer on one GPU: GEMMs, memory-bound kernels, layer collectives.

Model (all constants from `Efficiency`, fractions of the catalog's peaks):

- a GEMM of M x K by K x N costs 2 M K N / (peak x matmul) plus `gemm_memory` x its operand
  bytes 2 (M K + K N + M N) / (HBM x hbm): an additive roofline, so thin GEMMs (small
  hidden / TP) run further from peak than wide ones;
- memory-bound kernels (norms, residual adds, activation functions, softmax, dropout)
  move the bytes enumerated below at HBM x hbm; backward moves about as many again;
- attention is either unfused (Megatron 2021-22: batched GEMMs plus a materialised
  s x s softmax) or fused (flash: FlashAttention-2, flash1: FlashAttention-1 / Triton; causal: half the
  square, at the kernel's fraction of peak for this sequence length (attention.py), backward 2.5x);
- the collectives a layer issues: tensor parallel (2 all-reduces, or all-gather +
  reduce-scatter pairs with sequence parallel, per pass), expert all-to-all (dispatch +
  combine), context-parallel ring exchange of K and V.
"""

from __future__ import annotations

from dataclasses import dataclass

from musubi.plan.attention import flash_bwd_rate_fraction, flash_rate_fraction
from musubi.plan.cluster import Cluster
from musubi.plan.comm import Link, all_reduce_s, all_to_all_s, reduce_scatter_s
from musubi.plan.efficiency import Efficiency
from musubi.plan.layout import Layout
from musubi.plan.spec import TransformerSpec

ACT_BYTES = 2  # bf16/fp16 activations
#: Forward HBM bytes per token x hidden of the kernels outside the TP regions: two norms
#: (read 2 + write 2 each) and two residual adds (read 4 + write 2 each) = 20; dropout adds a
#: 1-byte mask per element after attention and after the MLP.
_REPLICATED_BYTES = 20
_DROPOUT_MASK_BYTES = 2
#: Backward of the memory-bound kernels moves about the forward's bytes again: residual adds
#: cost nothing backward (the gradient passes through), norms, softmax and dropout read the
#: saved tensor and the incoming gradient and write one (~1.5x their forward).
ELEMENTWISE_BWD = 1.0
#: Extra forward HBM bytes per element of an eager (unfused, PyTorch-op) stack over the fused kernel, counted op by op
#: from Hugging Face transformers' Llama (models/llama/modeling_llama.py): LlamaRMSNorm is .to(fp32) (read 2, write
#: 4), .pow(2) (4 + 4), .mean (4), x * rsqrt (4 + 4), .to(bf16) (4 + 2), weight * x (2 + 2) = 36 bytes against the
#: fused kernel's 4; apply_rotary_pos_emb is q * cos (2 + 2), -x2 on half the elements (1 + 1), torch.cat (2 + 2),
#: * sin (2 + 2), + (4 + 2) = 20 against 4 for each element of q and k; act_fn(gate) * up is silu (2 + 2) and a
#: product (4 + 2) = 10 against the fused 6. LayerNorm (torch's native kernel) and bias-GELU (the bias in the GEMM,
#: then one GELU) cost what the fused kernels do.
EAGER_RMSNORM_EXTRA = 32
EAGER_ROPE_EXTRA = 16
EAGER_SWIGLU_EXTRA = 4
#: The loss of transformers' LlamaForCausalLM: logits.float() (read 2, write 4), the shifted logits' .contiguous()
#: copy (4 + 4) and CrossEntropyLoss's log-softmax over fp32 (4 + 4): 22 bytes a logit against the fused loss's 10
#: (logits_times); backward as much again, as the other memory-bound kernels.
EAGER_LOSS_EXTRA = 12


@dataclass
class LayerTimes:
    """Seconds for one micro-batch through one layer on one GPU, by kind."""

    fwd: float = 0.0  # forward compute (GEMMs + memory-bound kernels)
    bwd: float = 0.0  # backward compute
    attn_core: float = 0.0  # forward of the attention core alone (what selective recompute reruns)
    gemm_fwd: float = 0.0  # forward GEMM time (what TP communication can hide under)
    gemm_flops_fwd: float = 0.0  # the FLOPs of those GEMMs (gemm_flops_fwd / gemm_fwd: their achieved rate)
    tp_fwd: float = 0.0  # TP collectives, forward pass
    tp_bwd: float = 0.0
    ep_fwd: float = 0.0  # expert all-to-all, forward pass
    ep_bwd: float = 0.0
    cp_fwd: float = 0.0  # context-parallel K/V ring, forward pass
    cp_bwd: float = 0.0


@dataclass(frozen=True)
class Device:
    """The numbers of one GPU the compute model needs (FLOP/s and bytes/s, already derated)."""

    flops: float  # dense peak x matmul efficiency
    peak: float  # dense peak
    hbm: float  # HBM bytes/s x hbm efficiency
    gemm_memory: float
    flash: float  # FlashAttention-2 class kernel's plateau fraction of peak
    flash1: float  # FlashAttention-1 / Triton-port kernel's plateau fraction of peak
    flash3: float  # FlashAttention-3 / cuDNN fused attention (Hopper) plateau fraction of peak


def device(cluster: Cluster, eff: Efficiency, precision: str) -> Device:
    """The derated compute and memory rates of the cluster's GPU at `precision`."""
    peak = cluster.gpu.peak(precision)
    achieved = cluster.gpu.achieved
    return Device(flops=peak * eff.fraction("matmul", achieved), peak=peak, hbm=cluster.gpu.hbm_gbps * 1e9 * eff.hbm,
                  gemm_memory=eff.gemm_memory, flash=eff.fraction("flash", achieved),
                  flash1=eff.fraction("flash1", achieved), flash3=eff.fraction("flash3", achieved))


def gemm_flops(m: float, k: float, n: float, batch: float = 1.0) -> float:
    """FLOPs of one (batched) GEMM [m x k] @ [k x n]."""
    return batch * 2 * m * k * n


def gemm_s(dev: Device, m: float, k: float, n: float, batch: float = 1.0) -> float:
    """One (batched) GEMM [m x k] @ [k x n], forward; its backward costs twice this."""
    flops = 2 * m * k * n
    traffic = ACT_BYTES * (m * k + k * n + m * n)
    return batch * (flops / dev.flops + dev.gemm_memory * traffic / dev.hbm)


@dataclass(frozen=True)
class Groups:
    """The links of the groups a layer talks over."""

    tp: Link
    cp: Link
    ep: Link


def layer_times(spec: TransformerSpec, layout: Layout, dev: Device, groups: Groups, moe: bool) -> LayerTimes:
    """Seconds for one micro-batch of `layout.micro` sequences through one layer (dense or MoE)."""
    t, cp, b = layout.tp, layout.cp, layout.micro
    sp = layout.sequence_parallel
    h, d, f = spec.hidden, spec.head_dim, spec.ffn
    kvd = spec.kv * d
    s_loc = spec.seq / cp  # this GPU's shard of each sequence
    tokens = b * s_loc  # T: tokens per GPU per micro-batch
    heads = spec.heads / t
    out = LayerTimes()

    # -- GEMMs (forward) ---------------------------------------------------------
    kv_cols = 2 * kvd * max(1, t // spec.kv) / t  # KV heads replicate when tp > kv_heads
    gemm = gemm_s(dev, tokens, h, h / t + kv_cols) + gemm_s(dev, tokens, h / t, h)
    up = (spec.mlp_matrices - 1)  # GELU: 1 up matrix, SwiGLU: gate + up
    if not moe:
        gemm += gemm_s(dev, tokens, h, up * f / t) + gemm_s(dev, tokens, f / t, h)
        out.gemm_flops_fwd = (gemm_flops(tokens, h, h / t + kv_cols) + gemm_flops(tokens, h / t, h)
                              + gemm_flops(tokens, h, up * f / t) + gemm_flops(tokens, f / t, h))
        act_width = f / t
    else:
        fm, local = spec.moe_ffn, spec.experts // layout.ep
        per_expert = tokens * spec.top_k * layout.ep / spec.experts  # tokens each local expert sees
        gemm += local * (gemm_s(dev, per_expert, h, up * fm / t) + gemm_s(dev, per_expert, fm / t, h))
        if spec.shared_experts:
            width = spec.shared_experts * fm
            gemm += gemm_s(dev, tokens, h, up * width / t) + gemm_s(dev, tokens, width / t, h)
        gemm += gemm_s(dev, tokens, h, spec.experts)  # router
        act_width = (spec.top_k + spec.shared_experts) * fm / t

    # -- attention core ------------------------------------------------------------
    if layout.attention in ("flash", "flash1", "flash3"):
        # causal: the kernel skips the masked half of the square; backward reruns the scores. Its rate
        # climbs with the keys one kernel call sees (s / cp under context parallelism): attention.py.
        plateau = {"flash": dev.flash, "flash1": dev.flash1, "flash3": dev.flash3}[layout.attention]
        rate = dev.peak * flash_rate_fraction(plateau, s_loc)
        core_fwd = 0.5 * 4 * tokens * spec.seq * h / t / rate
        # backward: 2.5x the forward's FLOPs at the backward kernel's (slower-climbing) rate
        core_bwd = 2.5 * core_fwd * rate / (dev.peak * flash_bwd_rate_fraction(plateau, s_loc))
        core_bytes = 0.0
    else:
        core_fwd = gemm_s(dev, s_loc, d, spec.seq, b * heads) + gemm_s(dev, s_loc, spec.seq, d, b * heads)
        core_bwd = 2 * core_fwd
        # scaled-masked softmax (read 2 + write 2 per score), dropout (read 2, write 2, mask 1)
        per_score = 4 + (5 if spec.dropout else 0)
        core_bytes = per_score * b * heads * s_loc * spec.seq

    # -- memory-bound kernels (forward bytes) ----------------------------------------
    replicated = (_REPLICATED_BYTES + (_DROPOUT_MASK_BYTES if spec.dropout else 0)) * tokens * h
    if sp:
        replicated /= t
    act = (4 if spec.mlp == "gelu" else 6) * tokens * act_width  # bias-GELU or SwiGLU: read + write
    rope = 0.0 if spec.learned_positions else 4 * tokens * (h + kvd) / t  # rotate q and k in place
    moe_bytes = 4 * ACT_BYTES * tokens * spec.top_k * h if moe else 0.0  # permute + unpermute, both ways
    eager = eager_extra_bytes(spec, tokens, h / t if sp else h, act_width, (h + kvd) / t) \
        if layout.kernels == "eager" else 0.0
    elem_fwd = (replicated + act + rope + moe_bytes + eager) / dev.hbm
    core_elem = core_bytes / dev.hbm

    out.gemm_fwd = gemm
    out.attn_core = core_fwd + core_elem
    out.fwd = gemm + elem_fwd + core_fwd + core_elem
    out.bwd = 2 * gemm + ELEMENTWISE_BWD * (elem_fwd + core_elem) + core_bwd

    # -- collectives of the layer -------------------------------------------------------
    if t > 1:
        msg = ACT_BYTES * tokens * h  # the [T, h] activation entering/leaving each TP region
        if sp:  # all-gather + reduce-scatter per region: the same bytes as one all-reduce
            one = 2 * reduce_scatter_s(msg, groups.tp)
        else:
            one = all_reduce_s(msg, groups.tp)
        out.tp_fwd = 2 * one  # attention and MLP
        out.tp_bwd = 2 * one
    if moe and layout.ep > 1:
        dispatched = ACT_BYTES * (tokens / t if sp else tokens) * spec.top_k * h
        out.ep_fwd = 2 * all_to_all_s(dispatched, groups.ep)  # dispatch + combine
        out.ep_bwd = out.ep_fwd
    if cp > 1:
        kv_shard = ACT_BYTES * tokens * 2 * kvd / t
        ring = (cp - 1) * kv_shard / groups.cp.busbw + (cp - 1) * groups.cp.latency_s
        out.cp_fwd = ring
        out.cp_bwd = 2 * ring  # K, V forward again and dK, dV back
    return out


def has_eager_work(spec: TransformerSpec) -> bool:
    """Whether eager and fused kernels differ for this architecture (RMSNorm, RoPE or SwiGLU present)."""
    return spec.norm == "rmsnorm" or not spec.learned_positions or spec.mlp == "swiglu"


def eager_extra_bytes(spec: TransformerSpec, tokens: float, norm_width: float, act_width: float,
                      rope_width: float) -> float:
    """Forward HBM bytes an eager stack's norms, RoPE and SwiGLU move beyond the fused kernels, for `tokens` tokens.

    `norm_width`: the elements a token's norm sees on this GPU (h, or h / tp with sequence parallelism), two norms a
    layer; `act_width`: the MLP's local hidden width; `rope_width`: the local widths of q and k together.
    """
    norm = EAGER_RMSNORM_EXTRA * 2 * norm_width if spec.norm == "rmsnorm" else 0.0
    rope = 0.0 if spec.learned_positions else EAGER_ROPE_EXTRA * rope_width
    act = EAGER_SWIGLU_EXTRA * act_width if spec.mlp == "swiglu" else 0.0
    return tokens * (norm + rope + act)


def logits_times(spec: TransformerSpec, layout: Layout, dev: Device) -> tuple[float, float]:
    """(forward, backward) seconds of the output projection and the loss for one micro-batch."""
    tokens = layout.micro * spec.seq / layout.cp
    vocab = spec.vocab / layout.tp
    fwd = gemm_s(dev, tokens, spec.hidden, vocab)
    loss_bytes = 10 * tokens * vocab  # read bf16 logits, write fp32 softmax, read it back for the loss
    if layout.kernels == "eager" and has_eager_work(spec):
        loss_bytes += EAGER_LOSS_EXTRA * tokens * vocab
    return fwd + loss_bytes / dev.hbm, 2 * fwd + loss_bytes / dev.hbm
