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

from musubi.plan.bubble import held_layer_microbatches
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


def chunk_layers(spec: TransformerSpec, layout: Layout) -> list[int]:
    """Layers of each model chunk in Megatron's order (chunk c of pipeline rank r is c x pp + r).

    Even when the layers divide. When they do not, the embedding and the output layer (with the
    loss) count as one layer each, so the first and the last chunk take one layer fewer: BLOOM's
    `--pp-partition-method type:transformer|embedding` (70 layers on 12 stages: 5, 6 x 10, 5;
    bigscience train/tr11-176B-ml/README.md) and Llama 3 405B (126 layers on 16 stages, "we reduce one
    Transformer layer each from the first and the last stages", Dubey et al. 2024, sec. 3.3.2);
    Megatron-LM's --account-for-embedding/loss-in-pipeline-split. Leftover units go to the chunks after
    the first.
    """
    chunks = layout.pp * layout.vpp
    base, extra = divmod(spec.layers, chunks)
    if extra == 0:
        return [base] * chunks
    base, extra = divmod(spec.layers + 2, chunks)
    counts = [base + (1 if 0 < c <= extra else 0) for c in range(chunks)]
    counts[0] -= 1
    counts[-1] -= 1
    return counts


def rank_chunks(spec: TransformerSpec, layout: Layout, rank: int) -> list[int]:
    """Layers of each model chunk pipeline rank `rank` holds (one entry per virtual stage)."""
    chunks = chunk_layers(spec, layout)
    return [chunks[c * layout.pp + rank] for c in range(layout.vpp)]


def stage_layers(spec: TransformerSpec, layout: Layout) -> tuple[int, int]:
    """(layers on the first stage, layers on the last stage)."""
    return sum(rank_chunks(spec, layout, 0)), sum(rank_chunks(spec, layout, layout.pp - 1))


def recomputed_share(spec: TransformerSpec, layout: Layout, rank: int | None = None) -> float:
    """Share of the layers (of pipeline rank `rank`, or of the whole model) whose forward is recomputed.

    recompute=full recomputes every layer unless `recompute_layers` = N says only the first N of each model
    chunk (Megatron-LM's block method: "the first N layers of each pipeline stage (chunk)", its
    --recompute-num-layers help); selective and none recompute no whole layer.
    """
    if layout.recompute != "full":
        return 0.0
    if not layout.recompute_layers:
        return 1.0
    chunks = rank_chunks(spec, layout, rank) if rank is not None else chunk_layers(spec, layout)
    total = sum(chunks)
    return sum(min(layout.recompute_layers, c) for c in chunks) / total if total else 0.0


def heaviest_middle_rank(spec: TransformerSpec, layout: Layout) -> int | None:
    """The pipeline rank between the first and the last with the most layers (the earliest on a tie), or None."""
    if layout.pp <= 2:
        return None
    return max(range(1, layout.pp - 1), key=lambda r: (sum(rank_chunks(spec, layout, r)), -r))


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


def largest_operator_params(spec: TransformerSpec, layout: Layout) -> float:
    """Parameters of the largest single weight one GPU holds (a per-parameter ZeRO-3 gather's unit).

    ZeRO-Infinity (Rajbhandari et al. 2021, sec. 3) names the h x 4h MLP projection as a
    Transformer's largest operator; the (fused) SwiGLU input projection, the fused QKV and, with a
    large vocabulary, the embedding can be larger, so all are compared. Split over TP.
    """
    h, kvd, t = spec.hidden, spec.kv * spec.head_dim, layout.tp
    ffn = spec.moe_ffn if spec.is_moe and spec.moe_layers == spec.layers else spec.ffn
    ops = [h * (h + 2 * kvd), h * ffn * (spec.mlp_matrices - 1), ffn * h, spec.vocab * h]
    return max(ops) / t


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
    schedule, pp = layout.pipeline_schedule, layout.pp
    largest_op = largest_operator_params(spec, layout)

    def stored(held: float, share: float) -> float:
        # A recomputed layer stores only its input, plus one layer's working set during backward; with block
        # recompute (`share` < 1) the other layers keep everything.
        if share > 0:
            return held * (share * layer_input + (1 - share) * avg_layer) + max(per_layer, per_moe_layer)
        return held * avg_layer

    # The first stage holds the most micro-batches in flight, the last owns the logits, and with an uneven
    # split a middle stage may hold more layers than either (rank 1: the most in flight of the middle ones).
    middle = heaviest_middle_rank(spec, layout)
    ranks = [0] + ([pp - 1] if pp > 1 else []) + ([middle] if middle is not None else [])
    best: MemoryBreakdown | None = None
    for rank in ranks:
        first, last = rank == 0, rank == pp - 1
        chunks = rank_chunks(spec, layout, rank)
        layers = sum(chunks)
        held = held_layer_microbatches(schedule, pp, layout.vpp, layout_m, rank,
                                       chunks if schedule == "interleaved" else [layers])
        dense, expert = stage_params(spec, layout, layers, first, last)
        z = layout.zero
        weights = precision.weights * (dense / shard + expert / expert_shard if z >= 3 else dense + expert)
        grads = precision.grads * (dense / shard + expert / expert_shard if z >= 2 else dense + expert)
        optim = precision.optimizer * (dense / shard + expert / expert_shard if z >= 1 else dense + expert)
        acts = stored(held, recomputed_share(spec, layout, rank))
        buffers = precision.weight_copy * (dense + expert)
        if last:  # logits and softmax for the loss
            buffers += precision.logits * tokens * spec.vocab / layout.tp
        if z >= 3 and layout.gather == "node":
            # per-unit flat buffers (PyTorch FSDP): two unsharded layers (computing, prefetched) with their grads
            buffers += 2 * (precision.weights + precision.grads) * (dense + expert) / max(layers, 1)
        elif z >= 3:
            # per-parameter gathers (DeepSpeed ZeRO-3): the operator computing and the one prefetched, each with
            # its gradient; ZeRO-Infinity's "model state working memory" (Rajbhandari et al. 2021, sec. 3)
            buffers += 2 * (precision.weights + precision.grads) * largest_op
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


def layout_precision(layout: Layout, precision: str) -> str:
    """The byte accounting of `precision` under the layout's gradient dtype: `grads=fp32` keeps fp32 main
    gradients (mixed -> mixed-fp32-grads); any other precision already says what its gradients are."""
    return "mixed-fp32-grads" if layout.grads == "fp32" and precision == "mixed" else precision


def estimate_memory(spec: ModelSpec, layout: Layout, global_batch: int | None = None,
                    precision: str = "mixed") -> MemoryBreakdown:
    """Peak memory of the most loaded GPU of a resolved layout (dp filled in), by component.

    `global_batch` (sequences) sets the micro-batches in flight; None means one micro-batch per rank.
    """
    if layout.dp is None:
        raise PlanError("estimate_memory needs a resolved layout (dp given); use resolve_layout first")
    if precision not in PRECISIONS:
        raise PlanError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    precision = layout_precision(layout, precision)
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
