"""Search: every layout that multiplies to the GPU count, minus those the cluster rules out, ranked by step time.

Rules, checked cheapest first, each rejection one line:
1. the degrees must divide the model (heads, layers, experts, sequence) and the global batch;
2. tensor parallel stays inside the NVLink domain (or, on GPUs without NVLink, the node):
   it issues two collectives per layer per pass that cannot wait, so the slowest link sets
   the pace of every layer;
3. the most loaded GPU must fit its memory (model state + activations + reserve).
Survivors are ranked by predicted step time (then by memory).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field, replace

from musubi.plan.cluster import Cluster
from musubi.plan.efficiency import DEFAULT_EFFICIENCY, Efficiency
from musubi.plan.errors import PlanError
from musubi.plan.layout import Layout, check_layout
from musubi.plan.memory import estimate_memory
from musubi.plan.predict import Prediction, predict
from musubi.plan.spec import GenericSpec, ModelSpec

_POW2 = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Rejection:
    """A layout the search dropped, the rule (`kind`) and the one-line reason."""

    layout: str
    kind: str
    reason: str


@dataclass
class SearchResult:
    """Ranked candidates (best first), the rejected layouts and how many were looked at."""

    candidates: list[Prediction]
    rejections: list[Rejection] = field(default_factory=list)
    evaluated: int = 0

    def rejection_summary(self) -> list[tuple[str, int, str]]:
        """(kind, count, first reason of that kind), most frequent first."""
        counts = Counter(r.kind for r in self.rejections)
        first: dict[str, str] = {}
        for r in self.rejections:
            first.setdefault(r.kind, f"{r.layout}: {r.reason}")
        return [(kind, n, first[kind]) for kind, n in counts.most_common()]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_limit(cluster: Cluster) -> tuple[int, str]:
    """Largest TP the cluster allows and the name of the domain that bounds it."""
    if cluster.gpu.nvlink_domain > 1 and cluster.gpu.nvlink_gbps > 0:
        return cluster.nvlink_domain, f"NVLink domain of {cluster.nvlink_domain}"
    return min(cluster.gpus_per_node, cluster.n_gpus), f"node of {cluster.gpus_per_node} (no NVLink)"


def _tp_reason(cluster: Cluster, tp: int) -> str:
    gpu = cluster.gpu
    limit, domain = tp_limit(cluster)
    fast = f"NVLink ({gpu.nvlink_gbps:g} GB/s per GPU)" if gpu.nvlink_gbps > 0 else f"PCIe ({gpu.pcie_gbps:g} GB/s)"
    slow = (f"the network ({gpu.nic_gbps:g} GB/s per GPU, shared with data and pipeline traffic)"
            if tp > cluster.gpus_per_node else f"PCIe ({gpu.pcie_gbps:g} GB/s)")
    return (f"tensor parallel spans {-(-tp // limit)} x the {domain} {gpu.name} GPUs: the collectives it "
            f"blocks on in every layer's forward and backward would leave {fast} for {slow}; keep tp <= {limit}")


def _mem_reason(spec: ModelSpec, layout: Layout, global_batch: int, cluster: Cluster, precision: str) -> str | None:
    mem = estimate_memory(spec, layout, global_batch, precision)
    if mem.total <= cluster.gpu.memory_gib:
        return None
    return (f"memory {mem.total:.1f} GiB > {cluster.gpu.memory_gib:g} GiB (weights {mem.weights:.1f}, grads "
            f"{mem.grads:.1f}, optimizer {mem.optimizer:.1f}, activations {mem.activations:.1f}, "
            f"other {mem.buffers + mem.reserve:.1f})")


def _layouts(spec: ModelSpec, n: int, global_batch: int) -> list[Layout]:
    """Every layout worth pricing; degrees that cannot multiply to n are never generated."""
    out: list[Layout] = []
    if isinstance(spec, GenericSpec):
        for micro, zero, rec in itertools.product(_POW2, (0, 1, 3), ("none", "full")):
            if global_batch % (n * micro) == 0 and not (n == 1 and zero):
                out.append(Layout(dp=n, micro=micro, zero=zero, recompute=rec))
        return out
    cps = [c for c in (1, 2, 4, 8, 16) if c == 1 or spec.seq // c >= 2048]
    for tp, cp in itertools.product(_POW2, cps):
        if n % (tp * cp) or tp > spec.heads:
            continue
        for pp in _divisors(n // (tp * cp)):
            if pp > spec.layers:
                break
            dp = n // (tp * cp * pp)
            eps = [e for e in _POW2 if spec.is_moe and spec.experts % e == 0 and (dp * cp) % e == 0] or [1]
            vpps = [v for v in (1, 2, 4) if v == 1 or (pp > 1 and spec.layers >= pp * v)]
            zeros = (1, 3) if dp * cp > 1 else (0,)
            for ep, vpp, micro, zero, rec in itertools.product(eps, vpps, (1, 2, 4, 8), zeros,
                                                                ("none", "selective", "full")):
                if global_batch % (dp * micro):
                    continue
                out.append(Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, micro=micro, zero=zero,
                                  recompute=rec))
    return out


def search(spec: ModelSpec, cluster: Cluster, global_batch: int, eff: Efficiency = DEFAULT_EFFICIENCY,
           precision: str = "bf16", memory_precision: str = "mixed", top: int | None = None,
           base: Layout | None = None) -> SearchResult:
    """Rank the layouts of `spec` on `cluster` by predicted step time, with a reason for each rejection.

    `base` carries options every candidate keeps (attention kernel, overlap, sharded gathers, schedule).
    """
    n = cluster.n_gpus
    limit, _ = tp_limit(cluster)
    result = SearchResult(candidates=[])
    reported_tp: set[int] = set()
    for layout in _layouts(spec, n, global_batch):
        if base is not None:
            layout = replace(layout, attention=base.attention, overlap=base.overlap, gather=base.gather,
                             schedule=base.schedule if layout.pp > 1 and base.schedule == "zb" else None)
        if layout.tp > limit:
            if layout.tp not in reported_tp:  # one line per TP degree, not per combination
                reported_tp.add(layout.tp)
                result.rejections.append(Rejection(f"tp={layout.tp}", "tp-crosses-domain",
                                                   _tp_reason(cluster, layout.tp)))
            continue
        try:
            check_layout(layout, spec, global_batch)
        except PlanError as e:
            result.rejections.append(Rejection(layout.text(), "shape", str(e)))
            continue
        reason = _mem_reason(spec, layout, global_batch, cluster, memory_precision)
        if reason:
            result.rejections.append(Rejection(layout.text(), "memory", reason))
            continue
        result.evaluated += 1
        result.candidates.append(predict(spec, cluster, layout, global_batch, eff, precision, memory_precision))
    result.candidates.sort(key=lambda p: (p.step_time_s, p.memory_gib_per_gpu))
    if top is not None:
        result.candidates = result.candidates[:top]
    return result
