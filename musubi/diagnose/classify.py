"""One label per job (or step window) with its evidence: where the step time goes, and why.

Labels: input bound, communication bound, straggler (rank r, section s),
periodic checkpoint stall, host/launch bound, memory pressure, healthy compute
bound. Each candidate carries the share of step time it costs; the largest
triggered one is the label, the rest are listed as further findings. A rank behind
only because its host lags (its GPU idles, its cores are quiet: telemetry/host_lag.py)
is a `host lag` finding, never the label: it is not a straggler.
"""

from __future__ import annotations

import statistics
from typing import Any

from musubi.diagnose.timeline import JobTelemetry
from musubi.telemetry.host_lag import foreign_share, host_lag, mean_figures
from musubi.telemetry.sections import SECTIONS
from musubi.telemetry.step_record import sections_ms, wall_ms
from musubi.telemetry.straggler import WARMUP, WINDOW, default_threshold, detect

#: Thresholds (fractions of step time) at which a cause is named. Chosen with the scenario suite
#: (`musubi.diagnose.drills`): healthy CPU and GPU runs stay well below each one.
INPUT_SHARE = 0.15
COMM_SHARE = 0.25
CHECKPOINT_SHARE = 0.05
#: A rank's GPU is "shared" when NVML saw another process on it in at least this share of the samples.
SHARED_SAMPLES = 0.5
HOST_BOUND_SM = 60.0  # % SM activity (or utilisation) under which an un-starved GPU is waiting for launches
#: Its batch wait (data + host-to-device) exceeds the other ranks' by this share of a step: input starved.
INPUT_LEAD = 0.01


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def breakdown(tele: JobTelemetry, steps: list[tuple[int, dict[int, dict]]]) -> dict[int, dict[str, Any]]:
    """Per rank: mean ms per section, mean wall, uncovered remainder, and span coverage of the wall."""
    out: dict[int, dict[str, Any]] = {}
    for rank in tele.ranks:
        recs = [recs[rank] for _, recs in steps if rank in recs]
        if not recs:
            continue
        means = {s: round(sum(sections_ms(r).get(s, 0.0) for r in recs) / len(recs), 3) for s in SECTIONS}
        walls = [wall_ms(r) for r in recs]
        cover = sorted(min(1.0, sum(sections_ms(r).values()) / w) for r, w in zip(recs, walls, strict=True) if w > 0)
        mean_wall = sum(walls) / len(walls)
        out[rank] = {"sections_ms": {k: v for k, v in means.items() if v}, "wall_ms": round(mean_wall, 3),
                     "uncovered_ms": round(mean_wall - sum(means.values()), 3),
                     "coverage_min": round(cover[0], 4) if cover else None,
                     "coverage_median": round(_median(cover), 4) if cover else None}
    return out


def _checkpoint(tele: JobTelemetry, steps: list[tuple[int, dict[int, dict]]]) -> dict[str, Any]:
    """Checkpoint time (slowest rank per step), how often, and its share of all step time."""
    total = sum(max(wall_ms(r) for r in recs.values()) for _, recs in steps)
    at, cost = [], []
    for k, recs in steps:
        c = max(sections_ms(r).get("checkpoint", 0.0) for r in recs.values())
        if c > 0:
            at.append(k)
            cost.append(c)
    period = _median([b - a for a, b in zip(at, at[1:], strict=False)]) if len(at) > 1 else None
    return {"count": len(at), "steps": at[:50], "mean_ms": round(_median(cost), 1) if cost else 0.0,
            "every_steps": period, "share": (sum(cost) / total) if total else 0.0}


def _gpu_figures(tele: JobTelemetry, first_t: float | None, last_t: float | None) -> dict[int, dict[str, Any]]:
    """Per rank, means of the hardware samples inside the analysed time span."""
    out: dict[int, dict[str, Any]] = {}
    for rank, samples in tele.samples.items():
        xs = [s for s in samples if (first_t is None or s["t"] >= first_t) and (last_t is None or s["t"] <= last_t)]
        if not xs:
            continue
        fig = mean_figures(xs, ("util", "sm_active", "power_w", "temp_c", "sm_clock_mhz", "proc_cpu", "workers_cpu",
                                "host_cpu", "cores_cpu", "cores"))
        used = [s["mem_used_gib"] / s["mem_total_gib"] for s in xs if s.get("mem_total_gib")]
        if used:
            fig["mem_used_max"] = round(max(used), 3)
        thr = sorted({t for s in xs for t in s.get("throttle", [])})
        if thr:
            fig["throttle"] = thr
        seen = [s for s in xs if isinstance(s.get("gpu_others"), int)]
        if seen:  # other processes on the rank's GPU (telemetry/sampler.py: Sampler._gpu_others)
            fig["gpu_shared"] = round(sum(1 for s in seen if s["gpu_others"] > 0) / len(seen), 3)
            fig["gpu_others_max"] = max(int(s["gpu_others"]) for s in seen)
            fig["gpu_others_mib_max"] = max(int(s.get("gpu_others_mib", 0) or 0) for s in seen)
        out[rank] = fig
    return out


def _memory(tele: JobTelemetry, first: int, last: int) -> dict[str, Any]:
    """Allocator retries gained inside the window (any rank)."""
    gained = 0
    for recs in tele.memory.values():
        xs = [r for r in recs if first <= int(r.get("step", 0)) <= last and "mem_alloc_retries" in r]
        if len(xs) >= 1:
            before = [r for r in recs if int(r.get("step", 0)) < first and "mem_alloc_retries" in r]
            base = before[-1]["mem_alloc_retries"] if before else 0
            gained = max(gained, int(xs[-1]["mem_alloc_retries"]) - int(base))
    return {"alloc_retries": gained}


def analyze(tele: JobTelemetry, first: int | None = None, last: int | None = None,
            threshold: float | None = None) -> dict[str, Any]:
    """The job's figures and its label with evidence (steps [first, last] when given)."""
    if threshold is None:
        configured = ((tele.job.get("config") or {}).get("telemetry") or {}).get("straggler_threshold")
        threshold = default_threshold(configured, tele.on_gpu)
    aligned = tele.aligned(first, last)
    if not aligned:
        return {"job": tele.name, "steps": 0, "label": None,
                "text": "no step telemetry (telemetry disabled, or the job never finished a step)"}
    steady = [(k, r) for k, r in aligned if k > WARMUP] or aligned
    k0, k1 = steady[0][0], steady[-1][0]
    n_ranks = len(tele.ranks)
    walls = [max(wall_ms(r) for r in recs.values()) for _, recs in steady]
    step_ms = _median(walls)

    def share(rec: dict, *names: str) -> float:
        w = wall_ms(rec)
        return sum(sections_ms(rec).get(n, 0.0) for n in names) / w if w else 0.0

    data = _median([statistics.mean(share(r, "data", "h2d") for r in recs.values()) for _, recs in steady])
    # The gradient sync is split from backward by DDP's comm hook; FSDP's reduce-scatters run inside
    # backward with no such mark, so exposed comm and the pre-sync view of each rank are not measured.
    strategy = str(((tele.job.get("config") or {}).get("train") or {}).get("strategy") or "")
    comm_measured = n_ranks < 2 or any("grad_comm" in sections_ms(r) for _, recs in steady for r in recs.values())
    limitations: list[str] = []
    if not comm_measured:
        why = "FSDP" if "fsdp" in strategy.lower() else "no gradient-sync mark was recorded"
        limitations.append(f"gradient communication not separable ({why}): exposed communication and the "
                           "straggler analysis before the sync are not measured (backward includes the sync, "
                           "which evens the ranks out); a slow rank or a communication-bound job is not detected")
    comm = _median([min(share(r, "grad_comm") for r in recs.values()) for _, recs in steady])
    ckpt = _checkpoint(tele, steady)
    strag = detect(aligned, threshold)
    # A median over a handful of steps is noise: with fewer steps than the live watch's window, no rank
    # is named (a healthy 16-step CPU run measured 5 % of "excess" on either rank).
    strag["judged"] = n_ranks < 2 or strag["steps"] >= WINDOW
    if not strag["judged"]:
        strag["stragglers"] = []
    if not strag["judged"] and comm_measured:
        limitations.append(f"stragglers: {strag['steps']} steady step(s) after warm-up, {WINDOW} "
                           "needed for a median that noise does not decide")
    t_first = min(r["t"] for r in steady[0][1].values())
    t_last = max(r["t"] + wall_ms(r) / 1e3 for r in steady[-1][1].values())
    gpu = _gpu_figures(tele, t_first, t_last)
    mem = _memory(tele, k0, k1)

    findings: list[dict[str, Any]] = []
    parts = breakdown(tele, steady)
    # A rank behind with its GPU idling for its own host and no other process on its cores is a launch-bound
    # job's host jitter (telemetry/host_lag.py): named, but not a straggler (the live watch does not flag it).
    strag["host_lag"] = []
    for s in strag["stragglers"]:
        ev = (f"rank {s['rank']} spends {_pct(s['excess'])} of a step longer than the other ranks, most in "
              f"{s['section']} (median of {strag['steps']} steps; {_pct(s['work_excess'])} over all its work before "
              "the gradient sync)")
        if s["last_share"] is not None:
            ev += f"; it arrived last at {_pct(s['last_share'])} of the gradient all-reduces"
        live = [int(f["step"]) for f in tele.flags if f.get("kind") == "straggler" and f.get("rank") == s["rank"]
                and isinstance(f.get("step"), int)]
        if live:
            ev += f"; flagged live at step {min(live)}"
        if s.get("flagged_at"):
            ev += f"; the detector, replayed over steps {k0}-{k1}, flags it at step {s['flagged_at']}"
        starved = _input_starved(s["rank"], parts, gpu, step_ms)
        lag = host_lag(s["rank"], gpu) if starved is None else None
        section, text = s["section"], f"straggler (rank {s['rank']}, section {s['section']})"
        cause = None
        if starved is not None:
            section, cause = starved["section"], "input starved"
            text = f"straggler (rank {s['rank']}, section {section}): input starved by CPU contention"
            ev = starved["evidence"] + "; " + ev
        elif lag is not None:
            strag["host_lag"].append(s)
            findings.append({"label": "host lag", "rank": s["rank"], "section": section, "share": s["excess"],
                             "text": f"host lag (rank {s['rank']}, section {section}): its host runs behind, not "
                                     "its GPU; not a straggler", "evidence": lag + "; " + ev, "cause": "host side",
                             "alarm": False})
            continue
        findings.append({"label": "straggler", "rank": s["rank"], "section": section, "share": s["excess"],
                         "text": text, "evidence": ev, "cause": cause})
    lagging = {s["rank"] for s in strag["host_lag"]}
    strag["stragglers"] = [s for s in strag["stragglers"] if s["rank"] not in lagging]
    shared = _shared_gpus(gpu, findings)
    if ckpt["count"] >= 2 and ckpt["share"] >= CHECKPOINT_SHARE:
        findings.append({"label": "periodic checkpoint stall", "share": ckpt["share"],
                         "text": "periodic checkpoint stall",
                         "evidence": f"{ckpt['count']} checkpoints, every {ckpt['every_steps']:g} steps, "
                                     f"{ckpt['mean_ms']:.0f} ms each: {_pct(ckpt['share'])} of all step time "
                                     f"(a normal step takes {step_ms:.1f} ms)"})
    if data >= INPUT_SHARE:
        findings.append({"label": "input bound", "share": data, "text": "input bound",
                         "evidence": f"ranks wait for the next batch (data + host-to-device) for "
                                     f"{_pct(data)} of each step (median)"
                                     + _cpu_evidence(gpu)})
    if comm >= COMM_SHARE and not strag["stragglers"]:
        findings.append({"label": "communication bound", "share": comm, "text": "communication bound",
                         "evidence": f"even the last rank to arrive waits {_pct(comm)} of each step for the "
                                     "gradient all-reduce (exposed, not overlapped with backward)"})
    retries = mem["alloc_retries"]
    mem_full = max((g.get("mem_used_max", 0.0) for g in gpu.values()), default=0.0)
    if retries > 0 or mem_full >= 0.97:
        findings.append({"label": "memory pressure", "share": 0.5 if retries else 0.1, "text": "memory pressure",
                         "evidence": f"{retries} allocator retries (cudaFree + retry) in the window; "
                                     f"GPU memory up to {_pct(mem_full)} used"})
    if tele.on_gpu and not strag["stragglers"]:  # with a straggler, the others' GPUs idle waiting for it
        host = _host_launch(tele, steady, gpu, explained=data + comm)
        if host is not None:
            findings.append(host)
    findings.sort(key=lambda f: -f["share"])
    alarms = [f for f in findings if f.get("alarm", True)]
    if alarms:
        top = alarms[0]
    else:
        busy = [g.get("sm_active", g.get("util")) for g in gpu.values() if "util" in g or "sm_active" in g]
        comm_ev = f"exposed gradient comm {_pct(comm)}" if comm_measured else "gradient comm not measured"
        ev = (f"no stall above its threshold: data {_pct(data)}, {comm_ev}, "
              f"checkpoint {_pct(ckpt['share'])} of step time; "
              + ("stragglers not analysable" if not comm_measured else
                 "no straggler" if strag["judged"] else "stragglers not judged (too few steps)"))
        if lagging:
            ev += f" (rank(s) {', '.join(map(str, sorted(lagging)))} behind on their host only: see host lag)"
        if shared:
            ev += (f"; rank(s) {', '.join(map(str, shared))} share their GPU with another process (see gpu shared: "
                   "the job runs at its pace, under the straggler bar)")
        if busy:
            ev += f"; GPU busy {statistics.mean(busy):.0f} % (mean over GPUs)"
        top = {"label": "healthy compute bound", "share": 1.0 - data - comm, "text": "healthy compute bound",
               "evidence": ev}
    return {
        "job": tele.name, "ranks": n_ranks, "device": "gpu" if tele.on_gpu else "cpu",
        "steps": len(aligned), "window": [k0, k1], "step_ms_median": round(step_ms, 3),
        "label": top["label"], "text": top["text"], "evidence": top["evidence"],
        # the top finding's culprit, where it names one: a straggler's rank, and the section the classifier
        # blames (an input-starved straggler's is data/h2d even when most of its lead sits in forward)
        "culprit": {k: top[k] for k in ("rank", "section", "cause") if top.get(k) is not None},
        "findings": [f for f in findings if f is not top],
        "limitations": limitations,
        "figures": {"data_share": round(data, 4), "grad_comm_share": round(comm, 4) if comm_measured else None,
                    "checkpoint": ckpt, "memory": mem, "hardware": gpu},
        "breakdown": parts, "stragglers": strag,
    }


def _shared_gpus(gpu: dict[int, dict[str, Any]], findings: list[dict[str, Any]]) -> list[int]:
    """Ranks whose GPU ran another process in at least SHARED_SAMPLES of the samples: said in a straggler's
    evidence (and as its cause, when no other was found) or, for a rank not flagged, as a `gpu shared` finding,
    evidence and not an alarm. A co-tenant takes GPU time from the rank's collectives as well as its compute,
    so the whole job slows by more than the rank's own work shows, which can stay under the straggler bar
    (BENCHMARKS.md, telemetry)."""
    out = []
    for rank, g in sorted(gpu.items()):
        if g.get("gpu_shared", 0.0) < SHARED_SAMPLES:
            continue
        out.append(rank)
        ev = (f"NVML saw {g['gpu_others_max']} other process(es) on rank {rank}'s GPU in {_pct(g['gpu_shared'])} of "
              f"the samples (up to {g['gpu_others_mib_max']} MiB of its memory)")
        mine = [f for f in findings if f["label"] == "straggler" and f.get("rank") == rank]
        if mine:
            mine[0]["evidence"] = ev + "; " + mine[0]["evidence"]
            if mine[0].get("cause") is None:
                mine[0]["cause"] = "GPU shared"
                mine[0]["text"] += ": its GPU is shared with another process"
            continue
        findings.append({"label": "gpu shared", "rank": rank, "share": 0.0, "alarm": False,
                         "text": f"GPU shared (rank {rank}): another process runs on its GPU",
                         "evidence": ev + "; it takes GPU time from this rank's kernels and collectives, which "
                                          "every rank waits for: the job runs slower than this rank's own work "
                                          "shows"})
    return out


def _cpu_evidence(gpu: dict[int, dict[str, Any]]) -> str:
    """Loader-worker and host CPU load, when sampled."""
    host = [g["host_cpu"] for g in gpu.values() if "host_cpu" in g]
    workers = [g["workers_cpu"] for g in gpu.values() if "workers_cpu" in g]
    if not host:
        return ""
    return f"; host CPU {statistics.mean(host):.0f} %, loader workers {statistics.mean(workers):.0f} % per rank"


def _input_starved(rank: int, parts: dict[int, dict[str, Any]], gpu: dict[int, dict[str, Any]],
                   step_ms: float) -> dict[str, Any] | None:
    """A straggler whose batch wait grew because other processes take its cores; None when not shown.

    Both must hold: its own cores are contended (telemetry/host_lag.py's foreign_share: busy, mostly with
    processes that are neither its training process nor its loader workers), and its batch wait (data +
    h2d) exceeds the other ranks' by INPUT_LEAD of a step. The same contention also slows the thread that
    launches its kernels, so most of its lead can sit in forward/backward: the cause is still the CPU, not
    the GPU.
    """
    g = gpu.get(rank) or {}
    foreign = foreign_share(g)
    if not foreign or rank not in parts or len(parts) < 2 or not step_ms:
        return None
    cores, busy = g["cores"], g["cores_cpu"]

    def wait(r: int, s: str) -> float:
        return parts[r]["sections_ms"].get(s, 0.0)

    others = [r for r in parts if r != rank]
    leads = {s: wait(rank, s) - statistics.median(wait(r, s) for r in others) for s in ("data", "h2d")}
    if sum(leads.values()) / step_ms < INPUT_LEAD:
        return None
    section = max(leads, key=lambda s: leads[s])
    mine = wait(rank, "data") + wait(rank, "h2d")
    theirs = statistics.median(wait(r, "data") + wait(r, "h2d") for r in others)
    peers = [gpu[r]["proc_cpu"] for r in others if "proc_cpu" in gpu.get(r, {})]
    ev = (f"rank {rank} waits {mine:.1f} ms a step for its batch (data + host-to-device) against {theirs:.1f} ms on "
          f"the other ranks; its {cores:g} core(s) are {busy:.0f} % busy, {_pct(foreign)} of that not its own "
          f"(its loader workers {g.get('workers_cpu', 0.0):.0f} %, its training process "
          f"{g.get('proc_cpu', 0.0):.0f} %" + (f" against {statistics.median(peers):.0f} % on the others" if peers
                                                 else "") + "): input starved by CPU contention")
    return {"section": section, "foreign": foreign, "evidence": ev}


def _host_launch(tele: JobTelemetry, steady: list, gpu: dict[int, dict[str, Any]],
                 explained: float = 0.0) -> dict[str, Any] | None:
    """GPU idle between kernels while the host is busy launching them (not data, not comm).

    `explained`: the share of a step the ranks wait for data or the exposed gradient all-reduce. The GPU
    idles then too (NCCL through host memory keeps few SMs busy), and the host's compute sections grow
    while DDP's hooks wait on the all-reduce, so only the idle share beyond it is the host's: with P2P off, a
    GPT that waited most of each step for the all-reduce was labelled host/launch bound before this
    subtraction (BENCHMARKS.md, telemetry).
    """
    busy = [g.get("sm_active", g.get("util")) for g in gpu.values() if "sm_active" in g or "util" in g]
    if not busy or statistics.mean(busy) >= HOST_BOUND_SM:
        return None
    compute = ("forward", "backward", "optimizer")
    host = sum(sum(r.get("host", {}).get(s, 0.0) for s in compute) for _, recs in steady for r in recs.values())
    dev = sum(sum(r.get("gpu", {}).get(s, 0.0) for s in compute) for _, recs in steady for r in recs.values())
    if not dev or host / dev < 0.9:
        return None
    idle = 1.0 - statistics.mean(busy) / 100 - explained
    if idle <= 0:
        return None
    return {"label": "host/launch bound", "share": idle, "text": "host/launch bound",
            "evidence": f"the GPUs are busy {statistics.mean(busy):.0f} % of the time while the host spends "
                        f"{host / dev:.2f}x the GPU's time issuing forward/backward/optimizer: kernels wait "
                        "for the CPU to launch them"}
