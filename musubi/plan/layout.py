"""A parallel layout (tp, pp, dp, cp, ep, vpp, ZeRO, recompute, micro-batch) and its parsing and checks.

Rank order is Megatron's: tp fastest, then cp, then dp (ep splits dp), then pp, so a
tensor-parallel group is consecutive ranks and lands in one node when tp <= node size.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace

from musubi.plan.errors import PlanError
from musubi.plan.spec import GenericSpec, ModelSpec

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "interleaved", "zb")
#: flash: FlashAttention-2 class (fused, causal-skipping); flash1: FlashAttention-1 / its Triton port
#: (fused, slower: attention.py); unfused: batched GEMMs and a materialised softmax (Megatron 2021-22).
#: flash3: FlashAttention-3 / cuDNN fused attention (Transformer Engine, SDPA's cuDNN backend; Hopper only,
#: elsewhere what FA2 gets).
ATTENTION = ("flash", "flash1", "flash3", "unfused")
#: `param`: a sharded (ZeRO-1/2) optimizer's all-gather of its updated parameters overlaps the next forward
#: (Megatron-LM --overlap-param-gather, Apex DistributedFusedAdam overlap_param_sync); a list without it
#: (`overlap=dp,pp,cp`) runs that gather after the step, as those flags' defaults, DeepSpeed ZeRO-1/2 and nanotron do.
OVERLAPS = ("dp", "pp", "tp", "cp", "ep", "param")
#: Where weight-sharded (ZeRO-3 / FSDP) gathers and reduce-scatters cross nodes. nic: at one GPU's own
#: NIC, what DeepSpeed ZeRO-3's per-parameter collectives moved on Selene in 2021 (Narayanan 2021
#: Table 2: ~21-23 GB/s per A100, flat from 384 to 1,536 GPUs). node: one flat buffer per unit (PyTorch
#: FSDP / FSDP2), which NCCL's rings spread over every NIC of the node like any large collective.
GATHERS = ("nic", "node")
#: The dtype gradients are accumulated and reduced in across data-parallel ranks. bf16: the modern default
#: (Megatron-Core's DistributedDataParallelConfig.grad_reduce_in_fp32 off, PyTorch FSDP with a bf16 reduce_dtype).
#: fp32: Megatron-LM's training scripts turn fp32 gradient accumulation and all-reduce on whenever bf16 is on
#: (megatron/training/arguments.py: accumulate_allreduce_grads_in_fp32; newer versions opt out with
#: --grad-reduce-in-bf16), Apex/NeMo's DistributedFusedAdam syncs in its fp32 dtype, DeepSpeed's BF16 optimizer; twice the gradient bytes on the wire and
#: 4 bytes of main gradient a parameter in memory (the `mixed-fp32-grads` accounting).
GRADS = ("bf16", "fp32")
#: How the memory-bound kernels outside attention are written. eager (the default): the PyTorch ops of the
#: architecture's reference code, Hugging Face transformers' Llama (LlamaRMSNorm upcasts to fp32, squares, averages,
#: scales and casts back; apply_rotary_pos_emb multiplies, negates, concatenates and adds; LlamaMLP's
#: act_fn(gate) * up), each op a kernel that reads and writes HBM (compute.eager_extra_bytes counts them); what
#: DeepSpeed and HF Trainer runs execute, and what PyTorch stacks run unless they opt into fused kernels
#: (PaddleNLP's use_fused_rms_norm / use_fused_rope flags, torchtitan's torch.compile). fused: one kernel each
#: (Megatron-Core/Transformer Engine's RMSNorm, fused RoPE and SwiGLU; XLA's fusions in MaxText and Pax; nanotron's
#: Triton RMSNorm): name it. LayerNorm (torch's own kernel) and GELU cost the same either way.
KERNELS = ("eager", "fused")
DEFAULT_KERNELS = "eager"
#: What a modern stack overlaps by default: gradient reduce and parameter gather (DP/FSDP),
#: pipeline sends, context-parallel ring exchange. TP collectives stay exposed unless the
#: framework overlaps them with GEMMs (TransformerEngine userbuffers): add `overlap=...,tp`.
DEFAULT_OVERLAP = frozenset({"dp", "pp", "cp", "param"})

_INT_KEYS = ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "micro", "recompute_layers", "bucket_mb")
_KEYS = (*_INT_KEYS, "recompute", "sp", "schedule", "attention", "gather", "grads", "kernels", "overlap")


@dataclass(frozen=True)
class Layout:
    """How one training job is split over GPUs; `dp=None` means "the rest of the GPUs"."""

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    cp: int = 1
    ep: int = 1
    vpp: int = 1  # interleaved virtual stages per GPU
    zero: int = 0  # 0 plain DP, 1 optimizer sharded, 2 + gradients, 3 + weights (FSDP)
    recompute: str = "none"
    #: with recompute=full, how many layers of each model chunk are recomputed (Megatron-LM's
    #: --recompute-method block --recompute-num-layers N; fms-fsdp's and torchtitan's "every k-th block"
    #: activation checkpointing); 0: every layer. The others keep all their activations.
    recompute_layers: int = 0
    micro: int = 1  # micro-batch in sequences (samples)
    sp: bool | None = None  # sequence parallel; None: on whenever tp > 1
    schedule: str | None = None  # None: interleaved when vpp > 1, else 1f1b
    attention: str = "flash"
    gather: str = "nic"  # how sharded collectives cross nodes (GATHERS); only with zero=3
    grads: str = "bf16"  # the dtype gradients are reduced in (GRADS)
    kernels: str = DEFAULT_KERNELS  # how norms, RoPE and the MLP activation are written (KERNELS)
    #: MiB of gradients per data-parallel bucket (each bucket is one collective that pays its ring or tree
    #: latency); 0: the stack's default (Megatron-Core's max(40M, 1M x dp) parameters for transformers, PyTorch
    #: DDP's 25 MiB for generic models). Apex/NeMo's DistributedFusedAdam: 100.
    bucket_mb: int = 0
    overlap: frozenset[str] = field(default=DEFAULT_OVERLAP)

    @property
    def world(self) -> int:
        """GPUs the layout uses (needs dp resolved)."""
        return self.tp * self.pp * self.cp * (self.dp or 1)

    @property
    def sequence_parallel(self) -> bool:
        """Whether activations outside the TP regions are split over the TP group."""
        return self.tp > 1 if self.sp is None else (self.sp and self.tp > 1)

    @property
    def pipeline_schedule(self) -> str:
        """The pipeline schedule, resolved from vpp when not given."""
        if self.schedule:
            return self.schedule
        return "interleaved" if self.vpp > 1 else "1f1b"

    def text(self) -> str:
        """The layout in `--layout` syntax (the keys that differ from defaults, plus the four degrees)."""
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"cp={self.cp}"]
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.vpp > 1:
            parts.append(f"vpp={self.vpp}")
        parts += [f"zero={self.zero}", f"recompute={self.recompute}"]
        if self.recompute_layers and self.recompute == "full":
            parts.append(f"recompute_layers={self.recompute_layers}")
        parts.append(f"micro={self.micro}")
        if self.sp is not None and self.tp > 1:
            parts.append(f"sp={'yes' if self.sp else 'no'}")
        if self.schedule == "zb":
            parts.append("schedule=zb")
        if self.attention != "flash":
            parts.append(f"attention={self.attention}")
        if self.gather != "nic" and self.zero >= 3:
            parts.append(f"gather={self.gather}")
        if self.grads != "bf16":
            parts.append(f"grads={self.grads}")
        if self.kernels != DEFAULT_KERNELS:
            parts.append(f"kernels={self.kernels}")
        if self.bucket_mb:
            parts.append(f"bucket_mb={self.bucket_mb}")
        if self.overlap != DEFAULT_OVERLAP:
            parts.append(f"overlap={','.join(sorted(self.overlap)) or 'none'}")
        return ",".join(parts)


def _bool(key: str, value: str) -> bool:
    if value.lower() in ("1", "yes", "true", "on"):
        return True
    if value.lower() in ("0", "no", "false", "off"):
        return False
    raise PlanError(f"layout {key}={value}: expected yes or no")


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise PlanError(f"layout {key}={value}: expected one of {', '.join(allowed)}")
    return value


def parse_layout(text: str) -> Layout:
    """Parse "tp=8,pp=16,dp=64,cp=1,ep=1,vpp=1,zero=1,recompute=selective,micro=1" (any subset).

    `overlap` takes a list: the items after it that have no "=" (`overlap=dp,pp,tp=8`), or
    `overlap=none`.
    """
    values: dict[str, object] = {}
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise PlanError("empty --layout; example: tp=8,pp=16,dp=64,zero=1,recompute=selective,micro=1")
    i = 0
    while i < len(items):
        item = items[i]
        if "=" not in item:
            raise PlanError(f"layout item {item!r}: expected key=value, e.g. tp=8")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in _KEYS:
            close = difflib.get_close_matches(key, _KEYS, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise PlanError(f"layout key {key!r} is unknown{hint}; known: {', '.join(_KEYS)}")
        if key in values:
            raise PlanError(f"layout key {key} is given twice")
        if key in _INT_KEYS:
            try:
                number = int(value)
            except ValueError:
                raise PlanError(f"layout {key}={value}: expected a whole number") from None
            low = 0 if key in ("zero", "recompute_layers", "bucket_mb") else 1
            if number < low or (key == "zero" and number > 3):
                bound = {"zero": "0..3", "recompute_layers": ">= 0 (0: every layer)",
                         "bucket_mb": ">= 0 (0: the stack's default)"}.get(key, ">= 1")
                raise PlanError(f"layout {key}={value}: must be {bound}")
            values[key] = number
        elif key == "recompute":
            values[key] = _choice(key, value, RECOMPUTE)
        elif key == "schedule":
            values[key] = _choice(key, value, SCHEDULES)
        elif key == "attention":
            values[key] = _choice(key, value, ATTENTION)
        elif key == "gather":
            values[key] = _choice(key, value, GATHERS)
        elif key == "grads":
            values[key] = _choice(key, value, GRADS)
        elif key == "kernels":
            values[key] = _choice(key, value, KERNELS)
        elif key == "sp":
            values[key] = _bool(key, value)
        else:  # overlap: this item and every following item without "="
            names = [value] if value else []
            while i + 1 < len(items) and "=" not in items[i + 1]:
                i += 1
                names.append(items[i])
            names = [] if names == ["none"] else names
            for n in names:
                _choice("overlap", n, OVERLAPS)
            values[key] = frozenset(names)
        i += 1
    return Layout(**values)  # type: ignore[arg-type]


def given_keys(text: str) -> frozenset[str]:
    """The keys a `--layout` text names (what the planner must not change when it fills the rest)."""
    return frozenset(item.split("=", 1)[0].strip() for item in text.split(",") if "=" in item)


def _product(layout: Layout, with_dp: bool) -> str:
    degrees = [f"tp={layout.tp}", f"pp={layout.pp}"] + ([f"dp={layout.dp}"] if with_dp else []) + [f"cp={layout.cp}"]
    return " x ".join(degrees)


def resolve_layout(layout: Layout, n_gpus: int) -> Layout:
    """Fill dp from the GPU count, or refuse a layout whose degrees do not multiply to it."""
    model = layout.tp * layout.pp * layout.cp
    if layout.dp is None:
        if n_gpus % model:
            raise PlanError(f"{_product(layout, False)} = {model} does not divide {n_gpus} GPUs; "
                            "change tp, pp or cp")
        layout = replace(layout, dp=n_gpus // model)
    elif model * layout.dp != n_gpus:
        hint = f": dp should be {n_gpus // model}" if n_gpus % model == 0 else "; change tp, pp or cp"
        raise PlanError(f"{_product(layout, True)} = {model * layout.dp} GPUs, but there are {n_gpus}{hint}")
    if layout.ep > 1 and (layout.dp * layout.cp) % layout.ep:  # type: ignore[operator]
        raise PlanError(f"ep={layout.ep} must divide dp x cp = {layout.dp * layout.cp} "  # type: ignore[operator]
                        "(experts are spread over data-parallel ranks)")
    return layout


def check_layout(layout: Layout, spec: ModelSpec, global_batch: int) -> None:
    """Refuse a resolved layout that cannot run this model and batch; one line names the factor."""
    dp = layout.dp or 1
    if isinstance(spec, GenericSpec):
        for key in ("tp", "pp", "cp", "ep", "vpp"):
            if getattr(layout, key) != 1:
                raise PlanError(f"{key}={getattr(layout, key)}: a generic (params + FLOPs) model is data "
                                f"parallel only; use {key}=1 (zero=3 shards it)")
    else:
        if spec.heads % layout.tp:
            raise PlanError(f"tp={layout.tp} does not divide heads={spec.heads}")
        if spec.kv % layout.tp and layout.tp % spec.kv:
            raise PlanError(f"tp={layout.tp} and kv_heads={spec.kv}: one must divide the other")
        if layout.pp * layout.vpp > spec.layers:
            raise PlanError(f"pp={layout.pp} x vpp={layout.vpp} = {layout.pp * layout.vpp} stages for "
                            f"{spec.layers} layers: at most one stage per layer")
        if layout.recompute_layers and layout.recompute != "full":
            raise PlanError(f"recompute_layers={layout.recompute_layers} needs recompute=full (it says how many "
                            f"layers of each chunk are fully recomputed); got recompute={layout.recompute}")
        chunk = -(-spec.layers // (layout.pp * layout.vpp))
        if layout.recompute_layers > chunk:
            raise PlanError(f"recompute_layers={layout.recompute_layers}: a model chunk has at most {chunk} layers "
                            f"here; use 1..{chunk}, or 0 for every layer")
        if layout.vpp > 1 and layout.pp == 1:
            raise PlanError(f"vpp={layout.vpp} needs pp > 1 (interleaving splits pipeline stages)")
        if layout.pipeline_schedule == "interleaved" and layout.vpp == 1:
            raise PlanError("schedule=interleaved needs vpp > 1")
        if layout.cp > 1 and spec.seq % (2 * layout.cp):
            raise PlanError(f"cp={layout.cp}: seq {spec.seq} must be divisible by 2 x cp (causal load balance)")
        if layout.ep > 1 and not spec.is_moe:
            raise PlanError(f"ep={layout.ep} needs a mixture-of-experts model; {spec.name} is dense")
        if layout.ep > 1 and spec.experts % layout.ep:
            raise PlanError(f"ep={layout.ep} does not divide experts={spec.experts}")
    if global_batch < 1:
        raise PlanError(f"global batch {global_batch}: must be >= 1 sequence")
    if global_batch % (dp * layout.micro):
        raise PlanError(f"global batch {global_batch} is not a multiple of dp={dp} x micro={layout.micro} "
                        f"= {dp * layout.micro}; change --global-batch, dp or micro")
    m = global_batch // (dp * layout.micro)
    if layout.pipeline_schedule == "interleaved" and m % layout.pp:
        raise PlanError(f"vpp={layout.vpp}: the interleaved schedule needs the {m} micro-batches per step to be "
                        f"a multiple of pp={layout.pp}; raise --global-batch or lower micro or pp")


def micro_batches(layout: Layout, global_batch: int) -> int:
    """Micro-batches each pipeline runs per step (gradient accumulation steps without PP)."""
    return global_batch // ((layout.dp or 1) * layout.micro)
