"""Fill the knobs a published (or typed) layout leaves out: micro-batch, interleaving depth, recomputation.

A paper that prints "TP 8 x PP 16" or "ZeRO-3 on 384 GPUs" rarely prints the micro-batch or
the number of interleaved stages, yet both move the step by tens of per cent: ZeRO-3 / FSDP
regathers every weight once per micro-batch (a micro-batch of 1 with 4 accumulation steps
moves 4x the bytes of one micro-batch of 4), and a 16-stage pipeline at 32 micro-batches idles
47 % without interleaving and 12 % with 4 virtual stages. A team that trained the run tuned what
it did not print, so the planner does the same, within the memory: each knob the layout does not
name is set to the value with the shortest predicted step among those whose memory fits the GPU
(recompute: none, selective, full; micro: the divisors of the per-replica batch up to 64; vpp:
1 and the virtual-stage counts that divide the layers). A knob the layout names is never changed.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from musubi.plan.cluster import Cluster
from musubi.plan.efficiency import DEFAULT_EFFICIENCY, Efficiency
from musubi.plan.errors import PlanError
from musubi.plan.layout import RECOMPUTE, Layout, resolve_layout
from musubi.plan.predict import Prediction, predict
from musubi.plan.spec import GenericSpec, ModelSpec

#: The knobs the planner may choose when a layout leaves them out.
FILLABLE = ("micro", "vpp", "recompute")
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


def _fill_candidates(spec: ModelSpec, cluster: Cluster, layout: Layout, given: frozenset[str], global_batch: int,
                     eff: Efficiency, precision: str, memory_precision: str) -> tuple[Layout, list[str],
                                                                                     list[tuple[Layout, Prediction]]]:
    """The resolved layout, its open knobs, and every candidate filling of them with its prediction."""
    layout = resolve_layout(layout, cluster.n_gpus)
    open_knobs = [k for k in FILLABLE if k not in given and not (k == "vpp" and layout.pp <= 1)]
    if not open_knobs:
        return layout, [], []
    options = {
        "micro": _micro_choices(layout, global_batch) if "micro" in open_knobs else [layout.micro],
        "vpp": _vpp_choices(spec, layout) if "vpp" in open_knobs else [layout.vpp],
        "recompute": list(RECOMPUTE) if "recompute" in open_knobs else [layout.recompute],
    }
    out: list[tuple[Layout, Prediction]] = []
    for micro, vpp, rec in itertools.product(options["micro"], options["vpp"], options["recompute"]):
        candidate = replace(layout, micro=micro, vpp=vpp, recompute=rec)
        try:
            out.append((candidate, predict(spec, cluster, candidate, global_batch, eff, precision, memory_precision)))
        except PlanError:  # e.g. interleaving needs the micro-batch count to be a multiple of pp
            continue
    return layout, open_knobs, out


def complete_layout(spec: ModelSpec, cluster: Cluster, layout: Layout, given: frozenset[str], global_batch: int,
                    eff: Efficiency = DEFAULT_EFFICIENCY, precision: str = "bf16",
                    memory_precision: str = "mixed") -> tuple[Layout, dict[str, str]]:
    """The layout with its unnamed knobs set to the fastest values that fit; and what was chosen, knob by knob."""
    layout, open_knobs, candidates = _fill_candidates(spec, cluster, layout, given, global_batch, eff, precision,
                                                      memory_precision)
    fitting = [(p.step_time_s, lay) for lay, p in candidates if p.fits]
    if not fitting:  # nothing fits (or nothing was open): leave the defaults, the prediction will say so
        return layout, {}
    chosen = min(fitting, key=lambda t: t[0])[1]
    return chosen, {k: str(getattr(chosen, k)) for k in open_knobs}


def faster_over_memory(spec: ModelSpec, cluster: Cluster, layout: Layout, given: frozenset[str], global_batch: int,
                       eff: Efficiency = DEFAULT_EFFICIENCY, precision: str = "bf16",
                       memory_precision: str = "mixed") -> Prediction | None:
    """The fastest filling the memory model rejected, when it beats the one that fits; None otherwise.

    The fill rests on the memory model: a published run may have fitted what the model puts a few GiB over
    (Llama 3 405B's interleaved pipeline at 8k GPUs: 90.8 GiB predicted on 80 GB H100s), so the planner says
    what it gave up and for how much memory.
    """
    _, _, candidates = _fill_candidates(spec, cluster, layout, given, global_batch, eff, precision, memory_precision)
    fitting = [p for _, p in candidates if p.fits]
    over = [p for _, p in candidates if not p.fits]
    if not over:
        return None
    fastest = min(over, key=lambda p: p.step_time_s)
    if fitting and fastest.step_time_s >= min(p.step_time_s for p in fitting):
        return None
    return fastest


#: Stack facts a layout may leave out, and the values a stack of the last five years may have.
STACK_ALTERNATIVES: dict[str, tuple[str, ...]] = {"attention": ("flash", "flash1", "unfused"),
                                                  "overlap": ("default", "none"), "gather": ("nic", "node")}


def stack_range(spec: ModelSpec, cluster: Cluster, layout: Layout, given: frozenset[str], global_batch: int,
                eff: Efficiency = DEFAULT_EFFICIENCY, precision: str = "bf16",
                memory_precision: str = "mixed") -> tuple[Prediction, Prediction, list[str]] | None:
    """The fastest and slowest predictions over the stack facts the layout does not name (attention kernel,
    communication overlap, how sharded gathers cross nodes), and the names of those facts; None when the
    layout names them all."""
    unknown = [k for k in STACK_ALTERNATIVES if k not in given and not (k == "gather" and layout.zero < 3)]
    if not unknown or isinstance(spec, GenericSpec):
        return None
    preds = []
    for values in itertools.product(*(STACK_ALTERNATIVES[k] for k in unknown)):
        changes: dict[str, object] = {}
        for key, value in zip(unknown, values, strict=True):
            if key == "overlap":
                changes[key] = layout.overlap if value == "default" else frozenset()
            else:
                changes[key] = value
        preds.append(predict(spec, cluster, replace(layout, **changes), global_batch, eff, precision,
                             memory_precision))
    preds.sort(key=lambda p: p.step_time_s)
    return preds[0], preds[-1], unknown
