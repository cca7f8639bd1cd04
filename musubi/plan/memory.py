"""Memory per GPU: model state by ZeRO stage / FSDP, activations by recompute, SP/CP and pipeline schedule.

Model state follows the ZeRO paper (Rajbhandari et al. 2020): mixed-precision Adam keeps
2 bytes of bf16 weights + 2 of gradients + 12 of fp32 master weights, momentum and
variance = 16 bytes/parameter; ZeRO-1 shards the 12 over the data-parallel group, ZeRO-2
also the gradients, ZeRO-3 (FSDP) also the weights. Plain PyTorch AMP (fp32 weights,
fp32 grads, Adam's two fp32 moments) is also 16 = 4 + 4 + 8.

Activations follow Korthikanti et al. 2022 (sec. 4), generalised to GQA, SwiGLU and
flash attention. Per layer and micro-batch, in bytes, with T tokens on the GPU:
outside the TP regions 10 T h (two norm inputs, QKV and MLP inputs, dropout masks;
split over TP only with sequence parallel), inside 2 T h (Q) + 4 T kv_dim (K, V) +
2 T h (projection input) + MLP internals (GELU 4 T f, SwiGLU 6 T f), split over TP;
unfused attention adds 5 a s^2 b (softmax, dropout mask and output; 2 a s^2 b without
dropout), which selective recompute drops; full recompute keeps only the 2 T h layer
input. The first pipeline stage holds the micro-batches in flight (see bubble.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from musubi.plan.bubble import in_flight_factor
from musubi.plan.errors import PlanError
from musubi.plan.layout import Layout, check_layout, micro_batches
from musubi.plan.spec import GenericSpec, ModelSpec, TransformerSpec

GIB = 2**30


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of weights, gradients and optimizer state, and how activations are kept."""

    name: str
    weights: float
    grads: float
    optimizer: float
    residual: float = 2  # bytes per element of the residual stream the norms save (fp32 under autocast)
    logits: float = 6  # bytes per logit at the loss: bf16 logits + fp32 softmax (+ fp32 grad under autocast)
    weight_copy: float = 0  # autocast keeps a bf16 copy of each weight for backward: 2 bytes/param

    @property
    def total(self) -> float:
        """Bytes per parameter of model state without sharding."""
        return self.weights + self.grads + self.optimizer


PRECISIONS = {
    # Megatron / DeepSpeed mixed precision with Adam (ZeRO paper's K = 12).
    "mixed": Precision("mixed", 2, 2, 12),
    # Megatron with fp32 gradient accumulation (main_grad) and the distributed optimizer.
    "mixed-fp32-grads": Precision("mixed-fp32-grads", 2, 4, 12),
    # PyTorch autocast: fp32 parameters and gradients, AdamW's exp_avg and exp_avg_sq (musubi runtime).
    "amp": Precision("amp", 4, 4, 8, residual=4, logits=10, weight_copy=2),
    # PyTorch autocast with SGD + momentum.
    "amp-sgd": Precision("amp-sgd", 4, 4, 4, residual=4, logits=10, weight_copy=2),
}

#: Memory the allocator does not see or cannot use: CUDA context (~0.5 GiB), NCCL and cuBLAS
#: workspaces, fragmentation. Added to the allocated estimate before comparing with the GPU.
RESERVE_GIB = 2.0


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak memory of the most loaded GPU, by component, in GiB."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    buffers: float  # unsharded FSDP units, logits, communication staging
    reserve: float

    @property
    def allocated(self) -> float:
        """What the caching allocator holds at peak (compare with torch.cuda.max_memory_allocated)."""
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers

    @property
    def total(self) -> float:
        """Allocated plus the reserve: what must fit in the GPU's memory."""
        return self.allocated + self.reserve

    def as_dict(self) -> dict[str, float]:
        """Components plus allocated and total, in GiB."""
        return {**asdict(self), "allocated": self.allocated, "total": self.total}


def stage_layers(spec: TransformerSpec, layout: Layout) -> tuple[int, int]:
    """(layers on the first stage, layers on the last stage); leftovers go to the first stages."""
    chunks = layout.pp * layout.vpp
    base, extra = divmod(spec.layers, chunks)
    first = sum(base + (1 if c * layout.pp < extra else 0) for c in range(layout.vpp))
    last = sum(base + (1 if (c * layout.pp + layout.pp - 1) < extra else 0) for c in range(layout.vpp))
    return first, last


def layer_params_per_gpu(spec: TransformerSpec, layout: Layout) -> tuple[float, float, float]:
    """(dense layer, MoE layer non-expert, MoE layer expert) parameters held per GPU."""
    t = layout.tp
    dense = spec.dense_layer_params() / t
    if not spec.is_moe:
        return dense, 0.0, 0.0
    expert, rest = spec.moe_layer_params()
    return dense, rest / t, expert / (t * layout.ep)


def stage_params(spec: TransformerSpec, layout: Layout, layers: int, first: bool, last: bool) -> tuple[float, float]:
    """(dense-sharded, expert) parameters on one GPU of a stage with `layers` layers."""
    dense_p, moe_rest, moe_expert = layer_params_per_gpu(spec, layout)
    n_moe = round(layers * spec.moe_layers / spec.layers)
    dense = (layers - n_moe) * dense_p + n_moe * moe_rest
    if first:
        dense += spec.embedding_params() / layout.tp
    if last and not (first and spec.tied_embeddings):
        dense += spec.head_params() / layout.tp
    return dense, n_moe * moe_expert


def activation_bytes_per_layer(spec: TransformerSpec, layout: Layout, moe: bool = False,
                               precision: Precision = PRECISIONS["mixed"]) -> float:
    """Bytes one layer keeps for backward for one micro-batch, before recompute."""
    t, b = layout.tp, layout.micro
    tokens = b * spec.seq / layout.cp
    h, kvd = spec.hidden, spec.kv * spec.head_dim
    # two norm inputs (residual stream), QKV and MLP inputs (2 bytes each), dropout masks (1 byte each)
    outside = (2 * precision.residual + 4 + (2 if spec.dropout else 0)) * tokens * h
    if layout.sequence_parallel:
        outside /= t
    if moe:
        width = (spec.top_k + spec.shared_experts) * spec.moe_ffn
        routing = 2 * 2 * tokens * spec.top_k * h + 4 * tokens * spec.experts  # permuted copies, router fp32
    else:
        width, routing = spec.ffn, 0.0
    mlp = (4 if spec.mlp == "gelu" else 6) * tokens * width
    inside = 2 * tokens * h + 4 * tokens * kvd + 2 * tokens * h + mlp + routing
    core = 0.0
    if layout.attention == "unfused" and layout.recompute == "none":
        core = (5 if spec.dropout else 2) * b * spec.heads * (spec.seq / layout.cp) * spec.seq
    return outside + (inside + core) / t


def _transformer_memory(spec: TransformerSpec, layout: Layout, global_batch: int,
                        precision: Precision) -> MemoryBreakdown:
    layout_m = micro_batches(layout, global_batch)
    shard = (layout.dp or 1) * layout.cp  # ZeRO/FSDP shards over data x context parallel ranks
    expert_shard = max(1, shard // layout.ep)
    per_layer = activation_bytes_per_layer(spec, layout, False, precision)
    per_moe_layer = activation_bytes_per_layer(spec, layout, True, precision) if spec.is_moe else per_layer
    tokens = layout.micro * spec.seq / layout.cp
    layer_input = 2 * tokens * spec.hidden / (layout.tp if layout.sequence_parallel else 1)
    frac_moe = spec.moe_layers / spec.layers
    avg_layer = (1 - frac_moe) * per_layer + frac_moe * per_moe_layer
    first_layers, last_layers = stage_layers(spec, layout)
    flight = in_flight_factor(layout.pipeline_schedule, layout.pp, layout.vpp, layout_m)

    def stored(layers_on_stage: int, microbatches_held: float) -> float:
        # Full recompute stores only each layer's input, plus one layer's working set during backward.
        if layout.recompute == "full":
            return layers_on_stage * microbatches_held * layer_input + max(per_layer, per_moe_layer)
        return layers_on_stage * microbatches_held * avg_layer

    best: MemoryBreakdown | None = None
    pp = layout.pp
    for first, last, layers, held in (
        (True, pp == 1, first_layers, flight * pp),  # stage 0 holds p micro-batches (1F1B)
        (pp == 1, True, last_layers, 1.0),  # the last stage holds one, but owns the logits
    ):
        dense, expert = stage_params(spec, layout, layers, first, last)
        z = layout.zero
        weights = precision.weights * (dense / shard + expert / expert_shard if z >= 3 else dense + expert)
        grads = precision.grads * (dense / shard + expert / expert_shard if z >= 2 else dense + expert)
        optim = precision.optimizer * (dense / shard + expert / expert_shard if z >= 1 else dense + expert)
        acts = stored(layers, held)
        buffers = precision.weight_copy * (dense + expert)
        if last:  # logits and softmax for the loss
            buffers += precision.logits * tokens * spec.vocab / layout.tp
        if z >= 3:  # two unsharded layers (the one computing, the one prefetched) with their grads
            buffers += 2 * (precision.weights + precision.grads) * (dense + expert) / max(layers, 1)
        mem = MemoryBreakdown(weights / GIB, grads / GIB, optim / GIB, acts / GIB, buffers / GIB, RESERVE_GIB)
        if best is None or mem.total > best.total:
            best = mem
    assert best is not None
    return best


def _generic_memory(spec: GenericSpec, layout: Layout, precision: Precision) -> MemoryBreakdown:
    shard = layout.dp or 1
    z = layout.zero
    p = float(spec.params)
    weights = precision.weights * (p / shard if z >= 3 else p)
    grads = precision.grads * (p / shard if z >= 2 else p)
    optim = precision.optimizer * (p / shard if z >= 1 else p)
    acts = spec.activation_bytes * layout.micro * (0.25 if layout.recompute == "full" else 1.0)
    buffers = precision.weight_copy * p
    if z >= 3:  # about a tenth of the model unsharded at once (the unit computing and the one prefetched)
        buffers += (precision.weights + precision.grads) * p / 10
    return MemoryBreakdown(weights / GIB, grads / GIB, optim / GIB, acts / GIB, buffers / GIB, RESERVE_GIB)


def estimate_memory(spec: ModelSpec, layout: Layout, global_batch: int | None = None,
                    precision: str = "mixed") -> MemoryBreakdown:
    """Peak memory of the most loaded GPU of a resolved layout (dp filled in), by component.

    `global_batch` (sequences) sets the micro-batches in flight; None means one micro-batch per rank.
    """
    if layout.dp is None:
        raise PlanError("estimate_memory needs a resolved layout (dp given); use resolve_layout first")
    if precision not in PRECISIONS:
        raise PlanError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    batch = global_batch if global_batch is not None else (layout.dp * layout.micro)
    check_layout(layout, spec, batch)
    if isinstance(spec, GenericSpec):
        return _generic_memory(spec, layout, PRECISIONS[precision])
    return _transformer_memory(spec, layout, batch, PRECISIONS[precision])


def estimate_memory_gib(spec: ModelSpec, layout: Layout, global_batch: int | None = None,
                        precision: str = "mixed") -> float:
    """Predicted peak GiB per GPU including the reserve (what the fleet packer and batch probe ask)."""
    return estimate_memory(spec, layout, global_batch, precision).total


def largest_micro_batch(spec: ModelSpec, layout: Layout, memory_gib: float, precision: str = "mixed",
                        limit: int = 4096) -> int:
    """Largest micro-batch (samples per GPU) whose predicted peak fits `memory_gib`; 0 if none does.

    The guess a batch probe starts from (`batch: auto`): memory grows monotonically with the
    micro-batch, so a bisection over 1..limit finds the edge.
    """
    def fits(micro: int) -> bool:
        lay = replace(layout, micro=micro)
        return estimate_memory(spec, lay, (lay.dp or 1) * micro, precision).total <= memory_gib

    if not fits(1):
        return 0
    low, high = 1, limit
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low
