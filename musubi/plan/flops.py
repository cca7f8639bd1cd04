"""FLOPs per training step, and the two conventions for quoting them.

Convention (the one Megatron papers use, so published rows compare directly):

- **model FLOPs** count what the model needs once: forward + backward = 3 x forward.
  A multiply-add is 2 FLOPs; attention scores and values count the full s x s
  square (no causal halving); the logit layer counts once per pass; a MoE layer
  counts the top_k + shared experts a token visits (plus the router). Used for MFU.
  For the GPT shape this is Korthikanti et al. 2022, App. A:
  72 B L s h^2 (1 + s/6h + V/12hL).
- **hardware FLOPs** add what recomputation runs again: full recompute adds one more
  forward of every transformer layer (not the logit layer); selective recompute adds
  the attention core (scores, softmax, values). Used for HFU. For the GPT shape with
  full recompute this is Narayanan et al. 2021, eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh).
"""

from __future__ import annotations

from musubi.plan.spec import GenericSpec, ModelSpec, TransformerSpec


def attention_linear_flops(spec: TransformerSpec, tokens: float) -> float:
    """QKV and output projections, forward, over `tokens` tokens."""
    h, kvd = spec.hidden, spec.kv * spec.head_dim
    return 2 * tokens * h * (h + 2 * kvd) + 2 * tokens * h * h


def attention_core_flops(spec: TransformerSpec, tokens: float, kv_len: float) -> float:
    """Scores (Q K^T) and weighted values (P V), forward, full square: 4 x tokens x kv_len x hidden."""
    return 4 * tokens * kv_len * spec.hidden


def mlp_flops(spec: TransformerSpec, tokens: float, moe: bool) -> float:
    """Dense MLP, or the visited experts (top_k + shared) and the router of a MoE MLP, forward."""
    if not moe:
        return 2 * tokens * spec.mlp_matrices * spec.hidden * spec.ffn
    visited = spec.top_k + spec.shared_experts
    return 2 * tokens * (spec.mlp_matrices * spec.hidden * spec.moe_ffn * visited + spec.hidden * spec.experts)


def layer_forward_flops(spec: TransformerSpec, tokens: float, kv_len: float, moe: bool = False) -> float:
    """One transformer layer's forward over `tokens` tokens attending to `kv_len` keys."""
    return (attention_linear_flops(spec, tokens) + attention_core_flops(spec, tokens, kv_len)
            + mlp_flops(spec, tokens, moe))


def logits_forward_flops(spec: TransformerSpec, tokens: float) -> float:
    """The output projection to the vocabulary, forward."""
    return 2 * tokens * spec.hidden * spec.vocab


def forward_flops_per_sequence(spec: TransformerSpec) -> float:
    """All layers and the logit layer, forward, for one sequence of spec.seq tokens."""
    s = spec.seq
    dense = spec.layers - spec.moe_layers
    return (dense * layer_forward_flops(spec, s, s) + spec.moe_layers * layer_forward_flops(spec, s, s, moe=True)
            + logits_forward_flops(spec, s))


def model_flops_per_step(spec: ModelSpec, global_batch: int) -> float:
    """Model FLOPs of one optimizer step (forward + backward = 3 forwards) over `global_batch` samples."""
    if isinstance(spec, GenericSpec):
        return 3 * spec.flops_per_sample * global_batch
    return 3 * forward_flops_per_sequence(spec) * global_batch


def recompute_flops_per_step(spec: ModelSpec, recompute: str, global_batch: int, share: float = 1.0) -> float:
    """FLOPs that activation recomputation adds to a step: full = layer forwards (of `share` of the layers, with
    block recompute), selective = attention core."""
    if isinstance(spec, GenericSpec):
        return spec.flops_per_sample * global_batch if recompute == "full" else 0.0
    s = spec.seq
    if recompute == "full":
        return share * (forward_flops_per_sequence(spec) - logits_forward_flops(spec, s)) * global_batch
    if recompute == "selective":
        return spec.layers * attention_core_flops(spec, s, s) * global_batch
    return 0.0


def hardware_flops_per_step(spec: ModelSpec, recompute: str, global_batch: int, share: float = 1.0) -> float:
    """Model FLOPs plus recomputation: what the GPUs actually execute (HFU numerator)."""
    return model_flops_per_step(spec, global_batch) + recompute_flops_per_step(spec, recompute, global_batch, share)


def narayanan_hfu_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021 eq. 3: FLOPs per iteration with full recompute (GPT shape)."""
    return 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def korthikanti_model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Korthikanti et al. 2022 App. A: model FLOPs per iteration (GPT shape)."""
    return 72 * batch * layers * seq * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * hidden * layers))
