"""Evaluate one layout: step time, TFLOP/s per GPU, MFU/HFU, memory, bubble, straggler tax, comm per tier.

Step time of the slowest pipeline stage (Megatron-style synchronous step):

    step = [m t_max + bubble m t_avg + m pp_exposed + dp_exposed + tied + optimizer] (1 + straggler tax)

t_max / t_avg: one micro-batch (forward + backward + recompute + exposed layer collectives)
on the slowest / an average stage; m: micro-batches per step; bubble: bubble.py;
dp_exposed: the gradient (and ZeRO parameter) collectives that do not hide under the
last backward; tied: a tied embedding's gradient all-reduce between the first and last stage;
optimizer: Adam's update streaming 28 bytes per local parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from musubi.plan.bubble import bubble_fraction
from musubi.plan.cluster import Cluster
from musubi.plan.comm import TIERS, Link, all_gather_s, all_reduce_s, p2p_s, place_group, reduce_scatter_s
from musubi.plan.compute import ACT_BYTES, Device, Groups, LayerTimes, device, layer_times, logits_times
from musubi.plan.efficiency import DEFAULT_EFFICIENCY, Efficiency
from musubi.plan.flops import hardware_flops_per_step, model_flops_per_step
from musubi.plan.layout import Layout, check_layout, micro_batches, resolve_layout
from musubi.plan.memory import (
    PRECISIONS,
    MemoryBreakdown,
    estimate_memory,
    heaviest_middle_rank,
    layout_precision,
    rank_chunks,
    recomputed_share,
    stage_layers,
    stage_params,
)
from musubi.plan.spec import GenericSpec, ModelSpec, TransformerSpec
from musubi.plan.straggler import straggler_tax

#: Adam's update reads gradient, master weight, two moments and writes three of them back plus
#: the low-precision copy: ~28 bytes of HBM traffic per parameter it owns.
OPTIMIZER_BYTES_PER_PARAM = 28


@dataclass(frozen=True)
class DataParallelComm:
    """The data-parallel (and ZeRO) collectives of one step: what they cost and what could hide them."""

    busy_s: float  # time the collectives take on their link
    exposed_s: float  # the part no compute hides
    bytes_per_gpu: float  # bytes each GPU sends per step
    gbps: float  # bus bandwidth they get per GPU, GB/s (0: no traffic)
    window_s: float  # compute they may overlap with (0: issued after it, or overlap off)
    tier: str  # the slowest tier they cross ("" without data parallelism)
    tail_s: float = 0.0  # of exposed_s: the last gradient bucket's collectives, which run after the backward
    after_step_s: float = 0.0  # of exposed_s: a sharded optimizer's parameter all-gather run after its step


@dataclass
class Prediction:
    """What one layout is predicted to do; times in seconds, memory in GiB, rates per GPU."""

    model: str
    gpu: str
    n_gpus: int
    layout: str
    global_batch: int
    seq: int
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    memory_gib_per_gpu: float
    fits: bool
    bubble_fraction: float
    straggler_tax: float
    micro_batches: int
    comm_s: dict[str, float] = field(default_factory=dict)  # busy time per tier per step
    exposed_comm_s: dict[str, float] = field(default_factory=dict)  # not hidden under compute
    breakdown_s: dict[str, float] = field(default_factory=dict)  # where the step's time goes
    memory_gib: dict[str, float] = field(default_factory=dict)  # memory by component
    #: Why, in numbers: the dense layer's GEMMs at this micro-batch as a fraction of dense peak
    #: (small micro-batches run further from peak), and the data-parallel traffic of a step.
    gemm_fraction_of_peak: float = 0.0
    data_parallel: DataParallelComm | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dictionary."""
        return asdict(self)


@dataclass
class _Comm:
    """Per-tier accumulators of busy and exposed communication time."""

    busy: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIERS, 0.0))
    exposed: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIERS, 0.0))

    def add(self, link: Link, busy: float, exposed: float) -> None:
        if link.size > 1:
            self.busy[link.tier] += busy
            self.exposed[link.tier] += exposed


def _hidden(comm: float, under: float, overlapped: bool, contention: float = 0.0) -> float:
    """Seconds `comm` adds to a step when it may overlap `under` seconds of compute.

    Compute beside a running collective slows by `contention` (Efficiency.contention), so hiding is not free:
    a collective shorter than the slowed compute adds comm x c / (1 + c) (the compute it delays); a longer one
    adds comm - under (it is the critical path). Without overlap it adds all of itself.
    """
    if not overlapped:
        return comm
    return max(0.0, comm - under, comm * contention / (1 + contention))


@dataclass(frozen=True)
class _MicroBatch:
    """One micro-batch through one layer: total time and the exposed/busy comm it contains."""

    fwd: float
    bwd: float
    tp_busy: float
    tp_exposed: float
    ep_busy: float
    ep_exposed: float
    cp_busy: float
    cp_exposed: float


def _micro_batch(lt: LayerTimes, layout: Layout, share: float, contention: float = 0.0) -> _MicroBatch:
    """One micro-batch through one layer; `share` of the layers rerun their forward inside backward."""
    ov = layout.overlap
    c = contention
    tp_f = _hidden(lt.tp_fwd, lt.gemm_fwd, "tp" in ov, c)
    tp_b = _hidden(lt.tp_bwd, 2 * lt.gemm_fwd, "tp" in ov, c)
    ep_f = _hidden(lt.ep_fwd, lt.fwd, "ep" in ov, c)
    ep_b = _hidden(lt.ep_bwd, lt.bwd, "ep" in ov, c)
    cp_f = _hidden(lt.cp_fwd, lt.attn_core, "cp" in ov, c)
    cp_b = _hidden(lt.cp_bwd, 2 * lt.attn_core, "cp" in ov, c)
    fwd = lt.fwd + tp_f + ep_f + cp_f
    bwd = lt.bwd + tp_b + ep_b + cp_b
    tp_busy, ep_busy, cp_busy = lt.tp_fwd + lt.tp_bwd, lt.ep_fwd + lt.ep_bwd, lt.cp_fwd + lt.cp_bwd
    tp_exp, ep_exp, cp_exp = tp_f + tp_b, ep_f + ep_b, cp_f + cp_b
    if share > 0:  # the forward, collectives included, runs again inside backward (on `share` of the layers)
        bwd += share * fwd
        tp_busy, ep_busy, cp_busy = (tp_busy + share * lt.tp_fwd, ep_busy + share * lt.ep_fwd,
                                     cp_busy + share * lt.cp_fwd)
        tp_exp, ep_exp, cp_exp = tp_exp + share * tp_f, ep_exp + share * ep_f, cp_exp + share * cp_f
    elif layout.recompute == "selective":
        bwd += lt.attn_core
    return _MicroBatch(fwd, bwd, tp_busy, tp_exp, ep_busy, ep_exp, cp_busy, cp_exp)


def _sharded_s(collective: Callable[[float, Link], float], nbytes: float, link: Link, units: int) -> float:
    """One pass of a sharded collective issued unit by unit (FSDP unit / ZeRO-3 layer): each pays the latency."""
    return units * collective(nbytes / units, link) if nbytes > 0 else 0.0


def _ring_bytes(nbytes: float, link: Link) -> float:
    """Bytes one rank sends in a ring all-gather / reduce-scatter of an `nbytes` buffer."""
    return (link.size - 1) / link.size * nbytes if link.size > 1 else 0.0


#: Megatron-Core's default gradient bucket: max(40M, 1M x data-parallel size) parameters
#: (`DistributedDataParallelConfig.bucket_size`: "larger DP sizes need larger buckets to ensure collectives do
#: not become latency-bound"). Bucketed gradient collectives overlap the backward bucket by bucket.
BUCKET_MIN_PARAMS = 40_000_000
BUCKET_PARAMS_PER_RANK = 1_000_000


#: PyTorch DDP's default `bucket_cap_mb` (25 MiB of gradients a bucket): what Musubi's own DDP workers use.
DDP_BUCKET_BYTES = 25 * 2**20


def dp_bucket_params(dp_size: int) -> int:
    """Parameters in one gradient bucket of a data-parallel group of `dp_size` ranks (Megatron-Core's default)."""
    return max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_RANK * dp_size)


def megatron_bucket_bytes(dp_size: int, grad_bytes: float) -> float:
    """Bytes of one Megatron-Core gradient bucket: `dp_bucket_params` x bytes per gradient."""
    return dp_bucket_params(dp_size) * grad_bytes


def torch_ddp_bucket_bytes(dp_size: int, grad_bytes: float) -> float:
    """Bytes of one PyTorch DDP gradient bucket: 25 MiB whatever the group size."""
    return float(DDP_BUCKET_BYTES)


def fixed_bucket_bytes(mib: int) -> Callable[[int, float], float]:
    """Buckets of `mib` MiB of gradients whatever the group size (a layout's `bucket_mb`: Apex's 100, DDP's 25)."""
    def bucket(dp_size: int, grad_bytes: float) -> float:
        return float(mib * 2**20)
    return bucket


def gradient_buckets(nbytes: float, dp_size: int, grad_bytes: float,
                     bucket_bytes: Callable[[int, float], float] = megatron_bucket_bytes) -> int:
    """Gradient buckets of `nbytes` on a data-parallel group of `dp_size`: each is a collective that pays its latency."""
    return max(1, math.ceil(nbytes / bucket_bytes(dp_size, grad_bytes))) if nbytes > 0 else 0


def _bucketed(collective: Callable[[float, Link], float], nbytes: float, link: Link, buckets: int) -> float:
    """`buckets` collectives of nbytes / buckets each (NCCL's ring or tree latency paid by every one)."""
    return buckets * collective(nbytes / buckets, link) if buckets > 0 else 0.0


def _bucket_tail(layout: Layout, links: tuple[tuple[float, Link], ...], grad_bytes: float,
                 weight_ratio: float, bucket_bytes: Callable[[int, float], float]) -> tuple[float, float]:
    """(reduce, gather) seconds of the gradient collectives no overlap can hide: the last bucket's.

    The bucket holding the first layers is ready only when the backward has finished, so its reduce (all-reduce,
    or reduce-scatter with a sharded optimizer) runs after all compute; with a sharded optimizer the updated
    weights of the first bucket are all-gathered before the next forward can start. At a fixed global batch a
    larger data-parallel group means fewer micro-batches and a larger bucket (max(40M, 1M x dp) parameters), so
    this tail grows with scale while the compute shrinks.
    """
    reduce = gather = 0.0
    for nbytes, link in links:
        if nbytes <= 0 or link.size <= 1:
            continue
        bucket = nbytes / gradient_buckets(nbytes, link.size, grad_bytes, bucket_bytes)
        if layout.zero >= 1:
            reduce += reduce_scatter_s(bucket, link)
            gather += all_gather_s(bucket * weight_ratio, link)
        else:
            reduce += all_reduce_s(bucket, link)
    return reduce, gather


def _overlapped_with_tail(comm: float, tail: float, under: float, contention: float) -> float:
    """Seconds `comm` adds when all but its `tail` may hide under `under` seconds of compute; the tail runs alone."""
    tail = min(tail, comm)
    return _hidden(comm - tail, under, True, contention) + tail


def _dp_comm(layout: Layout, dense_bytes: float, expert_bytes: float, weight_ratio: float, dp_link: Link,
             edp_link: Link, m: int, fwd_mb: float, bwd_mb: float, units: int = 1,
             recomputed: float = 0.0, contention: float = 0.0, grad_bytes: float = 2.0,
             bucket_bytes: Callable[[int, float], float] = megatron_bucket_bytes) -> DataParallelComm:
    """The data-parallel collectives of one step.

    ZeRO-3 / FSDP gathers the weights of each unit (a layer) before its forward and again before
    its backward (and once more for a fully recomputed forward), and reduce-scatters its gradients,
    every micro-batch: per step that is per-parameter traffic times the micro-batch count, which
    a smaller micro-batch does not shrink. Across nodes it runs at one GPU's NIC (`Link.one_nic`),
    or, with `gather=node` (flat per-unit buffers: PyTorch FSDP), over the node's NICs.
    Prefetching hides a gather under the previous unit's compute, never the first unit's of a
    pass; when a pass has less compute than traffic, the rest is exposed.
    Bucketed gradient collectives (DDP, ZeRO-1/2) hide under the last micro-batch's backward except
    their last bucket, which is ready only when the backward ends (`_bucket_tail`).
    A ZeRO-1/2 optimizer's all-gather of its updated parameters hides under the next forward (all but the
    first bucket) only where the stack overlaps it (`param` in the layout's overlap: Megatron-LM
    --overlap-param-gather, Apex overlap_param_sync); otherwise it runs after the step with nothing to hide
    under, the default of those flags, of DeepSpeed ZeRO-1/2 and of nanotron's ZeroDistributedOptimizer.
    """
    overlapped = "dp" in layout.overlap
    tail = 0.0  # ZeRO-3's per-unit traffic has its own first-unit exposure (exposed_of below)
    after_step = 0.0
    if layout.zero >= 3 and layout.gather == "nic":  # gather=node keeps the node-aggregated rings
        dp_link, edp_link = dp_link.one_nic(), edp_link.one_nic()
    links = ((dense_bytes, dp_link), (expert_bytes, edp_link))
    if layout.zero >= 3:
        gather = sum(_sharded_s(all_gather_s, b * weight_ratio, ln, units) for b, ln in links)
        scatter = sum(_sharded_s(reduce_scatter_s, b, ln, units) for b, ln in links)
        bwd_gathers = 1 + recomputed  # a recomputed forward gathers its weights again
        busy = m * ((1 + bwd_gathers) * gather + scatter)
        sent = m * sum(_ring_bytes(b * (1 + bwd_gathers) * weight_ratio + b, ln) for b, ln in links)

        def exposed_of(comm: float, under: float) -> float:
            return max(comm / units, _hidden(comm, under, overlapped, contention)) if overlapped else comm

        exposed = m * (exposed_of(gather, fwd_mb) + exposed_of(bwd_gathers * gather + scatter, bwd_mb))
        window = m * (fwd_mb + bwd_mb)
    elif layout.zero >= 1:  # distributed optimizer: reduce-scatter grads, all-gather updated weights
        counts = [gradient_buckets(b, ln.size, grad_bytes, bucket_bytes) for b, ln in links]
        scatter = sum(_bucketed(reduce_scatter_s, b, ln, k) for (b, ln), k in zip(links, counts, strict=True))
        gather = sum(_bucketed(all_gather_s, b * weight_ratio, ln, k) for (b, ln), k in zip(links, counts, strict=True))
        # ZeRO-2 keeps only its own shard of the gradients, so it cannot accumulate the rest over micro-batches:
        # the reduce-scatter runs after every backward (DeepSpeed's maintainers, deepspeedai/DeepSpeed#2252),
        # each one with its own last bucket. ZeRO-1 keeps full gradients and reduces once a step.
        scatters = m if layout.zero == 2 else 1
        busy = scatters * scatter + gather
        gather_hides = overlapped and "param" in layout.overlap
        if overlapped:
            s_tail, g_tail = _bucket_tail(layout, links, grad_bytes, weight_ratio, bucket_bytes)
            exposed = scatters * _overlapped_with_tail(scatter, s_tail, bwd_mb, contention)
            tail = scatters * min(s_tail, scatter)
            if gather_hides:
                exposed += _overlapped_with_tail(gather, g_tail, fwd_mb, contention)
                tail += min(g_tail, gather)
            else:
                exposed += gather
        else:
            exposed = scatters * scatter + gather
        after_step = 0.0 if gather_hides else gather
        sent = sum(_ring_bytes(b * (scatters + weight_ratio), ln) for b, ln in links)
        window = bwd_mb + fwd_mb
    else:
        busy = sum(_bucketed(all_reduce_s, b, ln, gradient_buckets(b, ln.size, grad_bytes, bucket_bytes)) for b, ln in links)
        tail = min(busy, _bucket_tail(layout, links, grad_bytes, weight_ratio, bucket_bytes)[0]) if overlapped else 0.0
        exposed = _overlapped_with_tail(busy, tail, bwd_mb, contention) if overlapped else busy
        sent = sum(2 * _ring_bytes(b, ln) for b, ln in links)
        window = bwd_mb
    used = [ln for b, ln in links if b > 0 and ln.size > 1]
    slowest = min(used, key=lambda ln: ln.busbw) if used else None
    return DataParallelComm(busy, exposed, sent, slowest.busbw / 1e9 if slowest else 0.0,
                            window if overlapped else 0.0, slowest.tier if slowest else "", tail, after_step)


def _finish(spec: ModelSpec, cluster: Cluster, layout: Layout, global_batch: int, seq: int, step_raw: float,
            eff: Efficiency, precision: str, mem: MemoryBreakdown, bubble: float, m: int, comm: _Comm,
            breakdown: dict[str, float], dpc: DataParallelComm, gemm_fraction: float) -> Prediction:
    n = cluster.n_gpus
    tax = straggler_tax(eff.straggler_cv, n)
    scale = eff.scale_for(layout.zero)
    step = step_raw * (1 + tax) * scale
    breakdown["straggler_s"] = step_raw * tax
    if scale != 1.0:
        breakdown["calibration_s"] = step - step_raw * (1 + tax)
    peak = cluster.gpu.peak(precision)
    model = model_flops_per_step(spec, global_batch)
    share = recomputed_share(spec, layout) if isinstance(spec, TransformerSpec) else 1.0
    hardware = hardware_flops_per_step(spec, layout.recompute, global_batch, share)
    return Prediction(
        model=spec.name, gpu=cluster.gpu.name, n_gpus=n, layout=layout.text(), global_batch=global_batch,
        seq=seq, step_time_s=step, tokens_per_s=global_batch * seq / step,
        model_tflops_per_gpu=model / (n * step) / 1e12, hardware_tflops_per_gpu=hardware / (n * step) / 1e12,
        mfu=model / (n * step * peak), hfu=hardware / (n * step * peak),
        memory_gib_per_gpu=mem.total, fits=mem.total <= cluster.gpu.memory_gib, bubble_fraction=bubble,
        straggler_tax=tax, micro_batches=m, comm_s=comm.busy, exposed_comm_s=comm.exposed,
        breakdown_s=breakdown, memory_gib=mem.as_dict(), gemm_fraction_of_peak=gemm_fraction,
        data_parallel=dpc,
    )


def _predict_transformer(spec: TransformerSpec, cluster: Cluster, layout: Layout, global_batch: int,
                         eff: Efficiency, precision: str, memory_precision: str) -> Prediction:
    dev: Device = device(cluster, eff, precision)
    tp, cp, dp, pp = layout.tp, layout.cp, layout.dp or 1, layout.pp
    groups = Groups(tp=place_group(cluster, eff, 1, tp), cp=place_group(cluster, eff, tp, cp),
                    ep=place_group(cluster, eff, tp * cp, layout.ep))
    dp_link = place_group(cluster, eff, tp, dp * cp)
    edp_link = place_group(cluster, eff, tp * layout.ep, max(1, dp * cp // layout.ep))
    pp_link = place_group(cluster, eff, tp * cp * dp, pp)
    m = micro_batches(layout, global_batch)

    dense_times = layer_times(spec, layout, dev, groups, moe=False)
    share = recomputed_share(spec, layout)
    dense = _micro_batch(dense_times, layout, share, eff.contention)
    moe = (_micro_batch(layer_times(spec, layout, dev, groups, moe=True), layout, share, eff.contention)
           if spec.is_moe else dense)
    frac_moe = spec.moe_layers / spec.layers
    logit_f, logit_b = logits_times(spec, layout, dev)

    def stage(layers: int, last: bool) -> tuple[float, float]:
        n_moe = layers * frac_moe
        f = (layers - n_moe) * dense.fwd + n_moe * moe.fwd + (logit_f if last else 0.0)
        b = (layers - n_moe) * dense.bwd + n_moe * moe.bwd + (logit_b if last else 0.0)
        return f, b

    first_layers, last_layers = stage_layers(spec, layout)
    # first, last and (uneven split) the heaviest middle stage: one of them is the slowest
    middle = heaviest_middle_rank(spec, layout)
    mid_layers = sum(rank_chunks(spec, layout, middle)) if middle is not None else 0
    stages = [stage(first_layers, pp == 1)] + ([stage(last_layers, True)] if pp > 1 else [])
    stages += [stage(mid_layers, False)] if middle is not None else []
    slow_f, slow_b = max(stages, key=lambda fb: fb[0] + fb[1])
    t_max = slow_f + slow_b
    t_avg = (spec.layers * ((1 - frac_moe) * (dense.fwd + dense.bwd) + frac_moe * (moe.fwd + moe.bwd))
             + logit_f + logit_b) / pp
    bubble = bubble_fraction(layout.pipeline_schedule, pp, m, layout.vpp)

    comm = _Comm()
    layers_slow = [first_layers, last_layers, mid_layers][stages.index((slow_f, slow_b))]
    n_moe_slow = layers_slow * frac_moe
    for busy, exposed, link in (
        (dense.tp_busy * (layers_slow - n_moe_slow) + moe.tp_busy * n_moe_slow,
         dense.tp_exposed * (layers_slow - n_moe_slow) + moe.tp_exposed * n_moe_slow, groups.tp),
        (moe.ep_busy * n_moe_slow, moe.ep_exposed * n_moe_slow, groups.ep),
        (dense.cp_busy * (layers_slow - n_moe_slow) + moe.cp_busy * n_moe_slow,
         dense.cp_exposed * (layers_slow - n_moe_slow) + moe.cp_exposed * n_moe_slow, groups.cp),
    ):
        comm.add(link, m * busy, m * exposed)

    # pipeline sends: one activation forward and one gradient back per micro-batch and virtual stage;
    # each TP rank sends its 1/tp slice over its own link (Megatron's scatter-gather).
    send = p2p_s(ACT_BYTES * layout.micro * spec.seq / cp * spec.hidden / tp, pp_link) if pp > 1 else 0.0
    pp_busy = m * 2 * layout.vpp * send
    pp_exposed = 0.0 if "pp" in layout.overlap else pp_busy
    comm.add(pp_link, pp_busy, pp_exposed)
    # a tied embedding lives on the first and the last stage: after the backward their two copies' gradients are
    # all-reduced (Megatron's embedding group, finalize_model_grads; DeepSpeed's tied modules), outside any overlap
    tied_s = 0.0
    if spec.tied_embeddings and pp > 1:
        tied_link = place_group(cluster, eff, tp * cp * dp * (pp - 1), 2)
        tied_s = all_reduce_s(PRECISIONS[memory_precision].grads * spec.vocab * spec.hidden / tp, tied_link)
        comm.add(tied_link, tied_s, tied_s)

    # data parallel: gradients of the most loaded stage (dense params over dp x cp, experts over dp x cp / ep).
    grad_bytes = PRECISIONS[memory_precision].grads
    weight_ratio = PRECISIONS[memory_precision].weights / grad_bytes
    params = [stage_params(spec, layout, first_layers, True, pp == 1)]
    if pp > 1:
        params.append(stage_params(spec, layout, last_layers, False, True))
    if middle is not None:
        params.append(stage_params(spec, layout, mid_layers, False, False))
    dense_p, expert_p = max(params, key=sum)
    dpc = _dp_comm(layout, dense_p * grad_bytes, expert_p * grad_bytes, weight_ratio, dp_link, edp_link, m,
                   slow_f, slow_b, units=max(1, round(layers_slow)) + 1, recomputed=share,
                   contention=eff.contention, grad_bytes=grad_bytes,
                   bucket_bytes=fixed_bucket_bytes(layout.bucket_mb) if layout.bucket_mb else megatron_bucket_bytes)
    dp_exposed = dpc.exposed_s
    comm.add(dp_link, dpc.busy_s, dp_exposed)

    shard = dp * cp if layout.zero >= 1 else 1
    owned = dense_p / shard + expert_p / max(1, shard // layout.ep if layout.zero >= 1 else 1)
    optimizer = OPTIMIZER_BYTES_PER_PARAM * owned / dev.hbm

    pipeline = m * t_max + bubble * m * t_avg
    step_raw = pipeline + pp_exposed + dp_exposed + tied_s + optimizer
    breakdown = {
        "compute_s": m * t_max - sum(comm.exposed.values()) + dp_exposed + pp_exposed + tied_s,
        "bubble_s": bubble * m * t_avg,
        "exposed_comm_s": sum(comm.exposed.values()),
        "optimizer_s": optimizer,
    }
    mem = estimate_memory(spec, layout, global_batch, memory_precision)
    gemm_fraction = dense_times.gemm_flops_fwd / (dense_times.gemm_fwd * dev.peak)
    return _finish(spec, cluster, layout, global_batch, spec.seq, step_raw, eff, precision, mem, bubble, m,
                   comm, breakdown, dpc, gemm_fraction)


def _predict_generic(spec: GenericSpec, cluster: Cluster, layout: Layout, global_batch: int,
                     eff: Efficiency, precision: str, memory_precision: str) -> Prediction:
    dp = layout.dp or 1
    m = micro_batches(layout, global_batch)
    rate = cluster.gpu.peak(precision) * spec.efficiency
    fwd = spec.flops_per_sample * layout.micro / rate
    bwd = 2 * fwd + (fwd if layout.recompute == "full" else 0.0)
    dp_link = place_group(cluster, eff, 1, dp)
    prec = PRECISIONS[memory_precision]
    comm = _Comm()
    dpc = _dp_comm(layout, spec.params * prec.grads, 0.0, prec.weights / prec.grads, dp_link, dp_link, m, fwd, bwd,
                   contention=eff.contention, grad_bytes=prec.grads,
                   bucket_bytes=fixed_bucket_bytes(layout.bucket_mb) if layout.bucket_mb else torch_ddp_bucket_bytes)
    dp_exposed = dpc.exposed_s
    comm.add(dp_link, dpc.busy_s, dp_exposed)
    owned = spec.params / (dp if layout.zero >= 1 else 1)
    optimizer = OPTIMIZER_BYTES_PER_PARAM * owned / (cluster.gpu.hbm_gbps * 1e9 * eff.hbm)
    step_raw = m * (fwd + bwd) + dp_exposed + optimizer
    breakdown = {"compute_s": m * (fwd + bwd), "bubble_s": 0.0, "exposed_comm_s": dp_exposed,
                 "optimizer_s": optimizer}
    mem = estimate_memory(spec, layout, global_batch, memory_precision)
    return _finish(spec, cluster, layout, global_batch, 1, step_raw, eff, precision, mem, 0.0, m, comm,
                   breakdown, dpc, spec.efficiency)


def predict(spec: ModelSpec, cluster: Cluster, layout: Layout, global_batch: int,
            eff: Efficiency = DEFAULT_EFFICIENCY, precision: str = "bf16",
            memory_precision: str = "mixed") -> Prediction:
    """Predict one layout (dp may be left out: the rest of the GPUs) for `global_batch` sequences per step."""
    layout = resolve_layout(layout, cluster.n_gpus)
    check_layout(layout, spec, global_batch)
    memory_precision = layout_precision(layout, memory_precision)  # grads=fp32: fp32 main gradients on the wire
    if isinstance(spec, GenericSpec):
        return _predict_generic(spec, cluster, layout, global_batch, eff, precision, memory_precision)
    return _predict_transformer(spec, cluster, layout, global_batch, eff, precision, memory_precision)
