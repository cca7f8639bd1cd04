"""Fill the knobs a published (or typed) layout leaves out: micro-batch, interleaving depth, recomputation.

A paper that prints "TP 8 x PP 16" or "ZeRO-3 on 384 GPUs" rarely prints the micro-batch or
the number of interleaved stages, yet both move the step by tens of per cent: ZeRO-3 / FSDP
regathers every weight once per micro-batch (a micro-batch of 1 with 4 accumulation steps
moves 4x the bytes of one micro-batch of 4), and a 16-stage pipeline at 32 micro-batches idles
47 % without interleaving and 12 % with 4 virtual stages. A team that trained the run tuned what
it did not print, so the planner does the same, within the memory: each knob the layout does not
name is set to the value with the shortest predicted step among those whose memory fits the GPU
(recompute: none, selective, full on every layer or on the first 1/4, 1/2 or 3/4 of each chunk's layers;
micro: the divisors of the per-replica batch up to 64; vpp:
1 and the virtual-stage counts that divide the layers; zero: 0 or 1). A knob the layout names is never changed.

ZeRO-1 is a fill, not a default, for the same reason: sharding the optimizer state over the data
(x context) parallel ranks moves the same bytes as the all-reduce it replaces (a reduce-scatter plus
an all-gather: Rajbhandari et al. 2020, sec. 7.1), so it costs no step time and frees 12 (d - 1) / d
bytes a parameter. Every large-model stack of the last four years ships it and large runs turn it on
(Megatron-LM's --use-distributed-optimizer, on in NeMo's GPT/Llama recipes; DeepSpeed ZeRO-1 in
BLOOM and MT-NLG; PyTorch's ZeroRedundancyOptimizer), and papers rarely print it: NVIDIA's
dgxc-benchmarking tables print TP/PP/CP/VP/MBS only, and without the sharded optimizer their Llama 3.1
70B layout does not fit an 80 GB H100 without full recompute, which those runs did not use.
ZeRO-2 and -3 change the traffic, so a layout must name them.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from musubi.plan.cluster import Cluster
from musubi.plan.compute import has_eager_work
from musubi.plan.efficiency import DEFAULT_EFFICIENCY, Efficiency
from musubi.plan.errors import PlanError
from musubi.plan.layout import RECOMPUTE, Layout, resolve_layout
from musubi.plan.predict import Prediction, predict
from musubi.plan.spec import GenericSpec, ModelSpec, TransformerSpec

#: The knobs the planner may choose when a layout leaves them out.
FILLABLE = ("micro", "vpp", "recompute", "zero")
#: How far over the GPU's memory a filling may be predicted and still be taken: the memory model's own
#: measured error (it missed DDP's gradient buckets by 8 % on a measured GPT: planner.md, Limits). A
#: filling inside that band is as likely to fit as not, and the runs a paper prints did fit.
FILL_MEMORY_TOLERANCE = 0.08
#: The ZeRO stages the fill may choose (1 costs no traffic over 0; 2 and 3 must be named).
ZERO_FILL = (0, 1)
MAX_MICRO = 64
VPP_CHOICES = (1, 2, 3, 4, 6, 8)


def _micro_choices(layout: Layout, global_batch: int) -> list[int]:
    per_replica = global_batch // (layout.dp or 1)
    return [m for m in range(1, min(per_replica, MAX_MICRO) + 1) if per_replica % m == 0] or [layout.micro]


def _vpp_choices(spec: ModelSpec, layout: Layout) -> list[int]:
    if isinstance(spec, GenericSpec) or layout.pp <= 1:
        return [1]
    # even chunks, or even once the embedding and the output layer count as one layer each (memory.chunk_layers)
    return [v for v in VPP_CHOICES if spec.layers % (layout.pp * v) == 0
            or (spec.layers + 2) % (layout.pp * v) == 0] or [1]


def _recompute_choices(spec: ModelSpec, layout: Layout, vpp: int) -> list[tuple[str, int]]:
    """(recompute, recompute_layers) the fill may choose: none, selective, full on every layer, and full on the
    first quarter, half or three quarters of each model chunk's layers (block recompute), when chunks have
    several layers."""
    choices = [(r, 0) for r in RECOMPUTE]
    if isinstance(spec, GenericSpec):
        return choices
    chunk = -(-spec.layers // (layout.pp * vpp))
    blocks = sorted({round(chunk * k / 4) for k in (1, 2, 3)} - {0, chunk})
    return choices + [("full", n) for n in blocks]


def _fill_candidates(spec: ModelSpec, cluster: Cluster, layout: Layout, given: frozenset[str], global_batch: int,
                     eff: Efficiency, precision: str, memory_precision: str) -> tuple[Layout, list[str],
                                                                                     list[tuple[Layout, Prediction]]]:
    """The resolved layout, its open knobs, and every candidate filling of them with its prediction."""
    layout = resolve_layout(layout, cluster.n_gpus)
    if "recompute_layers" in given and "recompute" not in given:  # N layers recomputed says recompute=full
        layout, given = replace(layout, recompute="full"), given | {"recompute"}
    replicas = (layout.dp or 1) * layout.cp  # ZeRO shards over data x context parallel ranks
    open_knobs = [k for k in FILLABLE if k not in given and not (k == "vpp" and layout.pp <= 1)
                  and not (k == "zero" and replicas <= 1)]
    if not open_knobs:
        return layout, [], []
    options = {
        "micro": _micro_choices(layout, global_batch) if "micro" in open_knobs else [layout.micro],
        "vpp": _vpp_choices(spec, layout) if "vpp" in open_knobs else [layout.vpp],
        "zero": list(ZERO_FILL) if "zero" in open_knobs else [layout.zero],
    }
    out: list[tuple[Layout, Prediction]] = []
    for micro, vpp, zero in itertools.product(options["micro"], options["vpp"], options["zero"]):
        recomputes = (_recompute_choices(spec, layout, vpp) if "recompute" in open_knobs
                      else [(layout.recompute, layout.recompute_layers)])
        for rec, rec_layers in recomputes:
            candidate = replace(layout, micro=micro, vpp=vpp, recompute=rec, recompute_layers=rec_layers, zero=zero)
            try:
                out.append((candidate, predict(spec, cluster, candidate, global_batch, eff, precision,
                                               memory_precision)))
            except PlanError:  # e.g. interleaving needs the micro-batch count to be a multiple of pp
                continue
    return layout, open_knobs, out


def fits_for_fill(prediction: Prediction, cluster: Cluster) -> bool:
    """Whether a candidate filling counts as fitting: predicted memory within the memory model's error of the GPU."""
    return prediction.memory_gib_per_gpu <= cluster.gpu.memory_gib * (1 + FILL_MEMORY_TOLERANCE)


def complete_layout(spec: ModelSpec, cluster: Cluster, layout: Layout, given: frozenset[str], global_batch: int,
                    eff: Efficiency = DEFAULT_EFFICIENCY, precision: str = "bf16",
                    memory_precision: str = "mixed") -> tuple[Layout, dict[str, str]]:
    """The layout with its unnamed knobs set to the fastest values that fit; and what was chosen, knob by knob."""
    layout, open_knobs, candidates = _fill_candidates(spec, cluster, layout, given, global_batch, eff, precision,
                                                      memory_precision)
    fitting = [(p.step_time_s, lay) for lay, p in candidates if fits_for_fill(p, cluster)]
    if not fitting:  # nothing fits (or nothing was open): leave the defaults, the prediction will say so
        return layout, {}
    chosen = min(fitting, key=lambda t: t[0])[1]
    filled = {k: str(getattr(chosen, k)) for k in open_knobs}
    if "recompute" in open_knobs and chosen.recompute_layers:
        filled["recompute_layers"] = str(chosen.recompute_layers)
    return chosen, filled


def faster_over_memory(spec: ModelSpec, cluster: Cluster, layout: Layout, given: frozenset[str], global_batch: int,
                       eff: Efficiency = DEFAULT_EFFICIENCY, precision: str = "bf16",
                       memory_precision: str = "mixed") -> Prediction | None:
    """The fastest filling the memory model rejected, when it beats the one that fits; None otherwise.

    The fill rests on the memory model: a published run may have fitted what the model puts a few GiB over
    (Llama 3 405B's interleaved pipeline at 8k GPUs: 90.8 GiB predicted on 80 GB H100s), so the planner says
    what it gave up and for how much memory.
    """
    _, _, candidates = _fill_candidates(spec, cluster, layout, given, global_batch, eff, precision, memory_precision)
    fitting = [p for _, p in candidates if fits_for_fill(p, cluster)]
    over = [p for _, p in candidates if not fits_for_fill(p, cluster)]
    if not over:
        return None
    fastest = min(over, key=lambda p: p.step_time_s)
    if fitting and fastest.step_time_s >= min(p.step_time_s for p in fitting):
        return None
    return fastest


def fits_instead(spec: ModelSpec, cluster: Cluster, layout: Layout, given: frozenset[str], global_batch: int,
                 eff: Efficiency = DEFAULT_EFFICIENCY, precision: str = "bf16",
                 memory_precision: str = "mixed") -> Prediction | None:
    """The fastest filling predicted to fit outright, when the one the fill took is only within the memory model's
    error (predicted over the GPU's memory); None when the fill's choice fits or nothing fits outright."""
    chosen, _ = complete_layout(spec, cluster, layout, given, global_batch, eff, precision, memory_precision)
    if predict(spec, cluster, chosen, global_batch, eff, precision, memory_precision).fits:
        return None
    _, _, candidates = _fill_candidates(spec, cluster, layout, given, global_batch, eff, precision, memory_precision)
    strict = [p for _, p in candidates if p.fits]
    return min(strict, key=lambda p: p.step_time_s) if strict else None


#: Stack facts a layout may leave out, and the values a stack of the last five years may have. `overlap`:
#: the default (dp, pp, cp, param), none, or also the layer collectives (tp, ep: Transformer Engine's userbuffers
#: in NeMo); `sp`: sequence parallelism (Megatron-LM from 2022) on, or off as every stack before it; `recompute`:
#: what the fill chose, or full recompute of every layer, the convention of the 2021-22 stacks (Megatron-LM
#: before selective recompute, DeepSpeed's pipeline engine, metaseq), whose runs checkpointed every layer even
#: where memory allowed less; `grads`: gradients reduced in bf16, or in fp32 as Megatron-LM's bf16 runs and
#: DeepSpeed's BF16 optimizer did (layout.GRADS); `kernels`: norms, RoPE and SwiGLU as the reference code's PyTorch
#: ops or fused (layout.KERNELS). The planner's point estimate is the modern stack (its kernels: the reference
#: code's unless named); the range spans the rest.
STACK_ALTERNATIVES: dict[str, tuple[str, ...]] = {"attention": ("flash", "flash1", "flash3", "unfused"),
                                                  "overlap": ("default", "none", "all"), "gather": ("nic", "node"),
                                                  "sp": ("default", "no"), "recompute": ("filled", "full"),
                                                  "grads": ("default", "fp32"), "kernels": ("eager", "fused")}
#: `overlap=all`: every collective the planner knows how to hide.
ALL_OVERLAP = frozenset({"dp", "pp", "cp", "param", "tp", "ep"})


def _open_stack_facts(layout: Layout, given: frozenset[str], spec: ModelSpec | None = None) -> list[str]:
    """The stack facts of STACK_ALTERNATIVES that the layout leaves unnamed and that change its step."""
    out = []
    for key in STACK_ALTERNATIVES:
        if key in given or (key == "recompute" and "recompute_layers" in given):
            continue
        if key == "kernels" and isinstance(spec, TransformerSpec) and not has_eager_work(spec):
            continue  # LayerNorm, GELU and learned positions: the same kernels either way
        if (key == "gather" and layout.zero < 3) or (key == "sp" and layout.tp <= 1):
            continue
        if key == "grads" and ((layout.dp or 1) * layout.cp <= 1 or layout.grads == "fp32"):
            continue  # no data-parallel reduction, or already fp32
        if key == "recompute" and layout.recompute == "full" and not layout.recompute_layers:
            continue  # already every layer
        out.append(key)
    return out


def _stack_change(key: str, value: str, layout: Layout) -> dict[str, object]:
    """The Layout fields one stack-fact value sets."""
    if key == "overlap":
        return {"overlap": {"default": layout.overlap, "none": frozenset(), "all": ALL_OVERLAP}[value]}
    if key == "sp":
        return {} if value == "default" else {"sp": False}
    if key == "recompute":
        return {} if value == "filled" else {"recompute": "full", "recompute_layers": 0}
    if key == "grads":
        return {} if value == "default" else {"grads": "fp32"}
    return {key: value}


def stack_range(spec: ModelSpec, cluster: Cluster, layout: Layout, given: frozenset[str], global_batch: int,
                eff: Efficiency = DEFAULT_EFFICIENCY, precision: str = "bf16",
                memory_precision: str = "mixed") -> tuple[Prediction, Prediction, list[str]] | None:
    """The fastest and slowest predictions over the stack facts the layout does not name (attention kernel,
    communication overlap, how sharded gathers cross nodes, sequence parallelism, recomputation convention, the
    gradients' reduction dtype), and
    the names of those facts; None when the layout names them all."""
    unknown = _open_stack_facts(layout, given, spec)
    if not unknown or isinstance(spec, GenericSpec):
        return None
    preds = []
    for values in itertools.product(*(STACK_ALTERNATIVES[k] for k in unknown)):
        changes: dict[str, object] = {}
        for key, value in zip(unknown, values, strict=True):
            changes.update(_stack_change(key, value, layout))
        preds.append(predict(spec, cluster, replace(layout, **changes), global_batch, eff, precision,
                             memory_precision))
    preds.sort(key=lambda p: p.step_time_s)
    return preds[0], preds[-1], unknown


def range_by_fact(spec: ModelSpec, cluster: Cluster, layout: Layout, given: frozenset[str], global_batch: int,
                  eff: Efficiency = DEFAULT_EFFICIENCY, precision: str = "bf16",
                  memory_precision: str = "mixed") -> dict[str, tuple[str, float, str, float]]:
    """Each unnamed stack fact varied alone from the point estimate: fact -> (fastest value, its step / the point
    estimate's, slowest value, its step / the point estimate's), widest first; what to pin first to narrow the
    range. Empty when the layout names every fact."""
    if isinstance(spec, GenericSpec):
        return {}
    base = predict(spec, cluster, layout, global_batch, eff, precision, memory_precision).step_time_s
    out: dict[str, tuple[str, float, str, float]] = {}
    for key in _open_stack_facts(layout, given, spec):
        steps = sorted((predict(spec, cluster, replace(layout, **_stack_change(key, value, layout)), global_batch,
                                eff, precision, memory_precision).step_time_s / base, value)
                       for value in STACK_ALTERNATIVES[key])
        (fast, fast_value), (slow, slow_value) = steps[0], steps[-1]
        out[key] = (fast_value, fast, slow_value, slow)
    return dict(sorted(out.items(), key=lambda kv: kv[1][1] / kv[1][3]))  # widest (smallest fast / slow) first
