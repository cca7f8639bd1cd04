"""Watchtower bench: the live straggler watch against REAL causes, and telemetry's cost against plain DDP.

Scenarios (`--part scenarios`), each a `musubi train` on --nproc ranks (4 on the lent machine) pinned to
equal shares of the machine's cores (MUSUBI_CPUS, as Musubi pins ranks); every cause hits rank 1:

- healthy          - resnet50 bs256 bf16 channels_last (examples/resnet50-bench.yaml, the reference step):
                     GPU bound, not launch bound (session 7's bs128 had SM active 57-78 % and its host jitter
                     flagged 4 of 10 segments); expect `healthy compute bound`, no flag.
- gpu_hog          - the same job; a second CUDA process runs back-to-back bf16 matmuls on rank 1's GPU only
                     (time-sliced with the job: a slower GPU, not a sleep); expect straggler rank 1 in
                     forward/backward. `gpu_hog_light` (opt-in): the hog busy --light-duty of the time.
- cpu_hog          - resnet50 bs128 fed by CPU loader workers (synthetic images made on the CPU, workers sized
                     for LOADER_HEADROOM x what the GPU eats at the healthy step) and CPU_HOG_PER_CORE
                     spinning processes pinned to rank 1's cores; expect straggler rank 1, section data: input
                     starved by CPU contention. `healthy_cpu_data` (opt-in): its control.
- p2p_off          - NCCL_P2P_DISABLE=1 for the job (NCCL falls back to SHM through host memory) on a GPT
                     made to be communication bound (COMM_GPT): expect `communication bound`.
                     `healthy_comm` (opt-in): the same job with P2P on.
- healthy_fcos     - (opt-in) fcos_resnet50_fpn bs16; expect healthy.

p2p_off on paper (COMM_GPT: 4 layers x hidden 1536, vocab 32768 tied, seq 256, batch 8 = 2048 tokens a rank):
parameters 4 x 12 x 1536^2 = 113 M in the blocks + 50 M embedding/head = 164 M, so 0.66 GB of fp32
gradients a step. Compute: 6 x 164 M x 2048 tokens = 2.0 TFLOP a rank, ~10 ms at 200 TFLOP/s (half of an
H100/H200's dense bf16), backward ~7 ms of it. A ring all-reduce moves 2 (n-1)/n x 0.66 GB = 0.98 GB per GPU
on 4 ranks: over NVLink (NCCL bus bandwidth ~350 GB/s) ~3 ms, hidden behind backward; with P2P off through
host memory (SHM, assumed 15-60 GB/s bus bandwidth) 16-65 ms, of which ~7 ms can overlap backward: the
exposed all-reduce is ~9-58 ms of a ~19-68 ms step, 0.45-0.85 of it, against the label's bar COMM_SHARE =
0.25 (exposed / compute ~1-6x). Measured on 4x H200 (2026-11-26, 7b6de92): 33 of a 45-ms step, 0.765. NCCL_SHM_DISABLE is left alone: sockets would make each
step several 100 ms and not fit the time.

A start-up costs ~40 s (session 7 on 2x H200: CLI, torchrun, imports, cudnn autotuning), the steps a few:
`--segments K` trains K x --steps steps in one job and judges each segment on its own (the replayed
detector per segment; segment 0 also has the live flag), so 10 verdicts per case cost one start-up.
Per verdict: label, culprit rank and section, evidence (per-rank section means, NVML util / SM activity,
loader and host CPU, how busy the culprit's cores are, the other processes NVML sees on its GPU), steps
to flag, false alarms (a detector flag or a live flag on a rank that is not the culprit; a rank held back
as host lag is neither), and host-lag notes; per job: where the wall time went (`time`). Overhead
(`--part overhead`): resnet50-bench bs256, `musubi train` with telemetry on, off, and `plain_ddp.py ...
wall` (the fair reference), interleaved, samples/s over steps 20-100 (musubi, from metrics.jsonl) and 80
timed steps after 15 (plain).

GPU (4 GPUs), from the repo root: 10 verdicts of 30 steps per case, cases in the order healthy, p2p_off,
gpu_hog, cpu_hog; on 4x H200 (2026-11-26, 7b6de92) the first three took 52 + 43 + 72 s (steps 55 / 46 / 124
ms, start-ups 29-36 s), 174 s in all; cpu_hog took 82 s on 4x H200 (2026-11-27, d18e166), so it runs only
when the budget still holds the longest case's time. The JSON is rewritten after every case; a case is not begun when less time is left before
--budget-s than the longest case so far took:

    NCCL_NVLS_ENABLE=0 python3 bench/watchtower.py --part scenarios --nproc 4 --runs 1 --segments 10 \
        --steps 30 --budget-s 250 --deadline-s 265 --json $OUT/watchtower.json

CPU rehearsal (2 gloo ranks, resnet18 at 16 px and a tiny GPT; the GPU hog becomes a CPU matmul hog on
rank 1's core, plain DDP is skipped):

    python bench/watchtower.py --cpu --part scenarios --runs 1 --segments 2 --steps 30 --json /tmp/watchtower-cpu.json

Tables are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.provenance import commit  # noqa: E402
from musubi.diagnose import drills  # noqa: E402
from musubi.diagnose.classify import analyze  # noqa: E402
from musubi.diagnose.timeline import load_job  # noqa: E402
from musubi.telemetry.straggler import PERSIST, WARMUP, WINDOW  # noqa: E402

CULPRIT = 1  # the rank every injected cause hits
STEPS = 50  # per scenario run (or segment): the live watch can flag from step WARMUP + WINDOW + PERSIST - 1 = 29
EARLIEST_FLAG = WARMUP + WINDOW + PERSIST - 1
#: Healthy loader capacity / what the GPU eats at the healthy (bs256, GPU-bound) step (cpu_data jobs):
#: 2.0 x 256 samples a step gives 11-12 workers on H200, as many as session 7 sized from its bs128 step.
LOADER_HEADROOM = 2.0
MAIN_BATCH = 256  # examples/resnet50-bench.yaml
CPU_DATA_BATCH = 128
#: The p2p_off job: little compute per gradient byte (the docstring works out its ratio).
COMM_GPT = {"model_args": {"layers": 4, "hidden": 1536, "heads": 12},
            "synthetic": {"seq_len": 256, "vocab": 32768}, "batch": 8}
#: Spinning processes per core of the culprit rank: 2 leave its loader workers a third of their cores
#: (the loader, sized for 2.5x, falls below what the GPU eats) and its launching thread enough not to
#: become the bottleneck first (4 made the CPU rehearsal's rank 1 too slow to finish at all).
CPU_HOG_PER_CORE = 2
OVH_WARMUP, OVH_STOP = 20, 100  # overhead: musubi's timed window (log records at both ends)
PLAIN_STEPS = 80  # plain_ddp.py times 80 steps after its own 15 warm-up steps


@dataclass(frozen=True)
class Case:
    """A scenario: which job, which cause, what the watch should say."""

    name: str
    job: str  # key of jobs(): main, cpu_data, comm, fcos
    cause: str  # '', gpu_hog, gpu_hog_light, cpu_hog, p2p_off
    expect: str  # the label
    rank: int | None = None  # the culprit
    sections: tuple[str, ...] = ()  # sections accepted as the culprit's


CASES = {c.name: c for c in (
    Case("healthy", "main", "", "healthy compute bound"),
    Case("gpu_hog", "main", "gpu_hog", "straggler", CULPRIT, ("forward", "backward", "optimizer")),
    Case("gpu_hog_light", "main", "gpu_hog_light", "straggler", CULPRIT, ("forward", "backward", "optimizer")),
    Case("healthy_cpu_data", "cpu_data", "", "healthy compute bound"),
    Case("cpu_hog", "cpu_data", "cpu_hog", "straggler", CULPRIT, ("data", "h2d")),
    Case("p2p_off", "comm", "p2p_off", "communication bound"),
    Case("healthy_comm", "comm", "", "healthy compute bound"),  # p2p_off's control: same batch, P2P on
    Case("healthy_fcos", "fcos", "", "healthy compute bound"),
)}
DEFAULT_CASES = "healthy,p2p_off,gpu_hog,cpu_hog"  # the two unproven first: a short call keeps them


# -- the hogs: this file run again as a child process ---------------------------------------------
def hog_gpu(device: str, duty: float, n: int) -> None:
    """Back-to-back matmuls on `device` (busy `duty` of the time), until killed."""
    import torch

    if device == "cpu":
        torch.set_num_threads(1)
    dt = torch.bfloat16 if device.startswith("cuda") else torch.float32
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    (a @ b).sum().item()
    print("ready", flush=True)
    while True:
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if duty < 1.0:
            time.sleep((time.perf_counter() - t0) * (1.0 - duty) / duty)


#: A spinning process on the cores given as argv[1] ('8,9,10'); plain Python, so 32 of them start in
#: milliseconds and take no memory to speak of (this file's imports would load torch into each).
CPU_SPIN = ("import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')}); "
            "print('ready', flush=True)\nwhile True: pass")


def start_hogs(cause: str, device: str, cpus: list[str], hog_gpu_index: str, light_duty: float,
               n: int) -> list[subprocess.Popen]:
    """The cause's processes, each started and ready (its CUDA context made) before training begins."""
    me = [sys.executable, str(Path(__file__).resolve())]
    procs: list[subprocess.Popen] = []
    if cause in ("gpu_hog", "gpu_hog_light"):
        duty = 1.0 if cause == "gpu_hog" else light_duty
        env = dict(os.environ)
        if device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = hog_gpu_index
            procs.append(subprocess.Popen([*me, "--hog-gpu", "cuda", str(duty), str(n)], env=env,
                                          stdout=subprocess.PIPE, text=True))
        else:  # CPU rehearsal: the "GPU" of rank 1 is its core
            procs.append(subprocess.Popen([*me, "--hog-gpu", "cpu", str(duty), str(n)], env=env,
                                          stdout=subprocess.PIPE, text=True,
                                          preexec_fn=lambda: os.sched_setaffinity(0, _cpus(cpus[CULPRIT]))))
    elif cause == "cpu_hog":
        for _ in range(CPU_HOG_PER_CORE * len(_cpus(cpus[CULPRIT]))):
            procs.append(subprocess.Popen([sys.executable, "-c", CPU_SPIN, ",".join(map(str, _cpus(cpus[CULPRIT])))],
                                          stdout=subprocess.PIPE, text=True))
    for p in procs:
        line = p.stdout.readline() if p.stdout else ""
        if "ready" not in line:
            stop_hogs(procs)
            raise RuntimeError(f"hog for {cause} did not start (exit {p.poll()})")
    return procs


def stop_hogs(procs: list[subprocess.Popen]) -> None:
    """Kill the processes this bench started (by their own handles)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(10)


def _cpus(cpulist: str) -> tuple[int, ...]:
    from musubi.topology.model import parse_cpulist

    return parse_cpulist(cpulist)


def rank_cpus(nproc: int) -> list[str]:
    """The allowed cores split into `nproc` equal consecutive sets (what MUSUBI_CPUS gets)."""
    from musubi.topology.model import format_cpulist

    allowed = sorted(os.sched_getaffinity(0))
    per = len(allowed) // nproc
    if per < 1:
        raise SystemExit(f"{len(allowed)} core(s) for {nproc} ranks: need at least one core per rank")
    return [format_cpulist(tuple(allowed[i * per:(i + 1) * per])) for i in range(nproc)]


# -- evidence ------------------------------------------------------------------------------------
def gpu_processes(index: str) -> list[dict[str, Any]] | None:
    """Compute processes NVML sees on GPU `index` (pid, MiB); None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(int(index))
        return [{"pid": p.pid, "mib": round((p.usedGpuMemory or 0) / 2**20)}
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    except Exception:
        return None


def sample_cost_ms(image_size: int, n: int = 48) -> float:
    """One synthetic CPU image (what a loader worker makes), single-threaded, in ms."""
    import torch

    from musubi.data.synthetic_classification import SyntheticClassification

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ds = SyntheticClassification(10_000, image_size, 1000)
    ds[0]
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        ds[i]
    torch.set_num_threads(threads)
    return (time.perf_counter() - t0) / n * 1e3


def judge(case: Case, job_dir: Path, first: int | None = None, last: int | None = None) -> dict[str, Any]:
    """Label, culprit, section, time to flag, false alarms and evidence of one run (steps [first, last])."""
    tele = load_job(job_dir)
    if first is not None or last is not None:
        tele = tele.window(first, last)
    a = analyze(tele)
    strag = a.get("stragglers") or {}
    flagged = {s["rank"]: s for s in strag.get("stragglers", [])}
    live = [f for f in tele.flags if f.get("kind") == "straggler"]
    live_first: dict[int, int] = {}
    for f in live:
        live_first[int(f["rank"])] = min(int(f["step"]), live_first.get(int(f["rank"]), int(f["step"])))
    log = (job_dir / "logs" / "rank0.log")
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    others = "".join(p.read_text(encoding="utf-8", errors="replace") for p in (job_dir / "logs").glob("rank*.log")
                     if p.name != "rank0.log")
    bd = a.get("breakdown") or {}
    row: dict[str, Any] = {
        "case": case.name, "cause": case.cause, "label": a.get("label"), "expect": case.expect,
        "evidence": a.get("evidence"), "step_ms": a.get("step_ms_median"), "steps": a.get("steps"),
        "flagged": sorted(flagged), "live_flags": sorted(live_first.items()),
        "sections_ms": {int(r): b["sections_ms"] for r, b in bd.items()},
        "coverage_min": min((b["coverage_min"] for b in bd.values() if b.get("coverage_min") is not None),
                            default=None),
        "hardware": (a.get("figures") or {}).get("hardware"),
        "grad_comm_share": (a.get("figures") or {}).get("grad_comm_share"),
        "data_share": (a.get("figures") or {}).get("data_share"),
        # ranks behind only on their (quiet) host: named by the diagnosis, held back by the live watch
        "host_lag": sorted(int(x["rank"]) for x in strag.get("host_lag", [])),
        "live_host_lag": sorted({int(f["rank"]) for f in tele.flags if f.get("kind") == "host_lag"}),
        "straggler_now_lines": len(re.findall(r"straggler now", text)),
        "watch_lines_off_rank0": len(re.findall(r"straggler: rank|straggler now", others)),
    }
    ok = a.get("label") == case.expect
    wrong = set(flagged) | set(live_first)
    if case.rank is not None:
        s = flagged.get(case.rank)
        row["culprit_rank"] = case.rank
        # The section the diagnosis blames (the classifier's, e.g. data for a rank starved of input by CPU
        # contention), not the detector's raw largest lead (there forward/backward: launches starve too).
        culprit = a.get("culprit") or {}
        section = culprit.get("section") if culprit.get("rank") == case.rank else (s["section"] if s else None)
        row["section"] = section if s else None
        row["detector_section"] = s["section"] if s else None
        row["excess"] = s["excess"] if s else None
        row["section_ok"] = bool(s) and section in case.sections
        row["live_flagged_at"] = live_first.get(case.rank)
        row["replayed_flagged_at"] = s.get("flagged_at") if s else None
        # Steps from the segment's start to the (replayed) flag: the live watch flags a job once, so a later
        # segment's time to flag is the same detector's, replayed on that segment alone.
        row["steps_to_flag"] = (s["flagged_at"] - (first or 1) + 1) if s and s.get("flagged_at") else None
        ok = ok and sorted(flagged) == [case.rank]
        wrong -= {case.rank}
    row["false_alarms"] = sorted(wrong)
    row["ok"] = ok and not wrong
    return row


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def timeline(job_dir: Path, wall: float) -> dict[str, float | None]:
    """Where a run's wall time went, from rank 0's log: start-up (CLI, launcher, imports, model, the first
    step's warm-up), steps, and the rest (teardown, the final writes)."""
    from datetime import datetime

    log = job_dir / "logs" / "rank0.log"
    marks: dict[str, float] = {}
    for line in (log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []):
        m = LOG_TIME.match(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        marks.setdefault("first_line", t)
        if "building the model" in line:
            marks.setdefault("build", t)
        if "first step" in line:
            marks.setdefault("first_step", t)
        if re.search(r"step \d+/\d+ ", line):
            marks.setdefault("step_logged", t)
        if "done:" in line:
            marks["done"] = t
    if "first_line" not in marks or "done" not in marks:
        return {"startup_s": None, "steps_s": None}
    to_first = marks.get("step_logged", marks["first_line"])
    in_rank = marks["done"] - marks["first_line"]
    return {"before_rank_log_s": round(wall - in_rank, 1),  # CLI + torchrun + imports, and teardown after `done`
            "build_s": round(marks.get("first_step", marks["first_line"]) - marks["first_line"], 1),
            "first_log_step_s": round(to_first - marks.get("first_step", marks["first_line"]), 1),
            "steps_s": round(marks["done"] - to_first, 1)}


# -- scenario runs -------------------------------------------------------------------------------
def gpt_job(work: Path, cpu: bool) -> Path:
    """The p2p_off / healthy_comm job file: COMM_GPT on the GPU (a tiny one on CPU), tokens made on the device."""
    import yaml

    shape = COMM_GPT if not cpu else {"model_args": {"layers": 2, "hidden": 64, "heads": 4},
                                      "synthetic": {"seq_len": 32, "vocab": 512}, "batch": 4}
    spec = {"name": "comm", "task": "lm", "model": "gpt", "model_args": shape["model_args"],
            "data": {"synthetic": {"train_size": 1_000_000, "val_size": 0, "on_device": True, **shape["synthetic"]}},
            "train": {"epochs": 1, "batch": shape["batch"], "lr": 1e-4, "base_batch": shape["batch"],
                      "precision": "fp32" if cpu else "bf16", "log_every": 10},
            "checkpoint": {"enabled": False}}
    p = work / "comm.yaml"
    p.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return p


def jobs(cpu: bool, work: Path) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """Job file and overrides of each job kind."""
    comm = gpt_job(work, cpu)
    if cpu:
        spec = {"name": "watch", "task": "classification", "model": "resnet18",
                "data": {"synthetic": {"train_size": 100_000, "val_size": 0, "image_size": 16, "num_classes": 10},
                         "workers": 0},
                "train": {"epochs": 1, "batch": 8, "lr": 0.05, "base_batch": 32, "log_every": 10},
                "checkpoint": {"enabled": False}}
        import yaml

        p = work / "watch.yaml"
        p.write_text(yaml.safe_dump(spec), encoding="utf-8")
        return {"main": (p, ()), "cpu_data": (p, ("data.workers=1",)), "comm": (comm, ()), "fcos": (p, ())}
    r50 = REPO / "examples/resnet50-bench.yaml"
    return {"main": (r50, ()),  # bs256 bf16 channels_last: GPU bound
            "cpu_data": (r50, (f"train.batch={CPU_DATA_BATCH}", "data.synthetic.on_device=false")),
            "comm": (comm, ()),
            "fcos": (REPO / "examples/fcos-bench.yaml", ())}


def run_scenarios(args: argparse.Namespace, work: Path, result: dict[str, Any], save: Any) -> None:
    """Every case `--runs` times, interleaved; rows into result['scenarios']."""
    device = "cpu" if args.cpu else "cuda"
    cpus = rank_cpus(args.nproc)
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    hog_index = visible[CULPRIT] if len(visible) > CULPRIT else str(CULPRIT)
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}: choose from {', '.join(CASES)}")
    js = jobs(args.cpu, work)
    image = 16 if args.cpu else 224
    cost = sample_cost_ms(image)
    result["scenario_setup"] = {"rank_cpus": cpus, "sample_ms_one_core": round(cost, 3), "steps": args.steps,
                                "earliest_live_flag": EARLIEST_FLAG, "hog_gpu": hog_index,
                                "cpu_hog_procs": CPU_HOG_PER_CORE * len(_cpus(cpus[CULPRIT]))}
    rows: list[dict[str, Any]] = result.setdefault("scenarios", [])
    workers: int | None = None
    result["scenario_setup"]["segments"] = args.segments
    deadline = min(time.monotonic() + args.budget_s, args.deadline)
    took: dict[str, float] = {}  # per case: how long its last run took (a run that cannot end in time is not begun)
    for i in range(args.runs):
        for name in names:
            case = CASES[name]
            # A case not run yet is expected to take as long as the longest case so far (a run cut at the
            # deadline loses all its verdicts: better not begun).
            if time.monotonic() + took.get(name, max(took.values(), default=0.0)) > deadline:
                rows.append({"case": name, "run": i, "ok": False, "label": "skipped (--budget-s spent)"})
                continue
            began = time.monotonic()
            job, sets = js[case.job]
            sets = (*sets, "checkpoint.enabled=false")
            if case.job == "cpu_data" and not args.cpu:
                if workers is None:  # loader sized from the healthy step (this machine's GPU) and sample cost
                    step = next((r["step_ms"] for r in rows if r.get("case") == "healthy" and r.get("step_ms")),
                                None)
                    per_rank = len(_cpus(cpus[CULPRIT]))
                    need = LOADER_HEADROOM * MAIN_BATCH * cost / step if step else per_rank - 1
                    workers = max(1, min(per_rank - 1, math.ceil(need)))
                    result["scenario_setup"].update(loader_workers=workers, loader_workers_wanted=round(need, 1))
                sets = (*sets, f"data.workers={workers}")
            env = {"MUSUBI_CPUS": ";".join(cpus)}
            if case.cause == "p2p_off":
                env["NCCL_P2P_DISABLE"] = "1"
            out = work / f"{name}-{i}"
            shutil.rmtree(out, ignore_errors=True)
            hogs: list[subprocess.Popen] = []
            procs_seen = None
            steps = args.steps * args.segments
            try:
                hogs = start_hogs(case.cause, device, cpus, hog_index, args.light_duty, 2048 if args.cpu else 8192)
                left = args.deadline - time.monotonic()  # a run past the hard deadline is stopped
                job_dir, wall = drills.train_once(job, out, args.nproc, device, steps, "", sets,
                                                  timeout_s=max(30.0, min(args.run_timeout_s, left)), env_extra=env)
                if device == "cuda" and case.cause.startswith("gpu_hog"):
                    procs_seen = gpu_processes(hog_index)
            except (RuntimeError, subprocess.TimeoutExpired) as e:  # one failed run must not lose the rest
                rows.append({"case": name, "run": i, "ok": False, "label": "error", "error": str(e)[-2000:]})
                print(json.dumps({"case": name, "run": i, "error": str(e)[-400:]}), flush=True)
                save()
                continue
            finally:
                stop_hogs(hogs)
            spent = timeline(job_dir, wall)
            # One job, `--segments` judgements: each segment of --steps steps is diagnosed on its own (the
            # live watch flags a job once; later segments replay the same detector), so a start-up of
            # tens of seconds buys several judgements. Segment 0 includes the warm-up steps, as a fresh run.
            for j in range(args.segments):
                row = judge(case, job_dir, j * args.steps + 1, (j + 1) * args.steps)
                row.update(run=i, segment=j, wall_s=round(wall, 1), sets=list(sets), env=env)
                if j == 0:
                    row["time"] = spent
                if procs_seen is not None:
                    row["gpu_processes_on_culprit_gpu"] = procs_seen
                rows.append(row)
                print(json.dumps({k: row.get(k) for k in ("case", "run", "segment", "label", "ok", "flagged",
                                                          "section", "steps_to_flag", "false_alarms", "step_ms")}),
                      flush=True)
            print(json.dumps({"case": name, "run": i, "wall_s": round(wall, 1), **spent}), flush=True)
            if args.keep_report and name in ("gpu_hog", "cpu_hog") and i == 0:
                from musubi.diagnose.command import build_report

                args.keep_report.mkdir(parents=True, exist_ok=True)
                rep = build_report(out, args.keep_report / f"watchtower-{device}-{name}.html")
                print(f"kept {rep['html']}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
            took[name] = time.monotonic() - began
            save()
    result["scenario_summary"] = summarize(rows)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case: right labels, culprit and section right, live flag steps, false alarms."""
    out = []
    for name in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == name]
        s: dict[str, Any] = {"case": name, "runs": len(rs), "jobs": len({r.get("run") for r in rs if "segment" in r}),
                             "right": sum(bool(r.get("ok")) for r in rs),
                             "labels": sorted({str(r.get("label")) for r in rs}),
                             "false_alarms": sum(bool(r.get("false_alarms")) for r in rs),
                             "host_lag": sum(bool(r.get("host_lag") or r.get("live_host_lag")) for r in rs),
                             "step_ms": [r.get("step_ms") for r in rs]}
        if any("culprit_rank" in r for r in rs):
            s["section_right"] = sum(bool(r.get("section_ok")) for r in rs)
            s["sections"] = [r.get("section") for r in rs]
            s["live_flagged_at"] = [r.get("live_flagged_at") for r in rs]
            s["steps_to_flag"] = [r.get("steps_to_flag") for r in rs]
            s["flagged_within_50"] = sum(1 for r in rs if r.get("steps_to_flag") and r["steps_to_flag"] <= 50)
        times = [r["time"] for r in rs if r.get("time", {}).get("steps_s") is not None]
        if times:
            s["startup_s_median"] = statistics.median(r["before_rank_log_s"] + r["build_s"] + r["first_log_step_s"]
                                                      for r in times)
        out.append(s)
    return out


def markdown(summary: list[dict[str, Any]]) -> str:
    """The BENCHMARKS.md table of the scenarios."""
    lines = ["| case | judged (jobs) | right label + culprit | labels seen | culprit section (right) | steps to flag "
             f"(earliest {EARLIEST_FLAG}) | false alarms | host lag (not alarms) | median step ms | start-up + teardown s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        steps = [x for x in s["step_ms"] if x]
        sec = (f"{', '.join(str(x) for x in s['sections'])} ({s['section_right']}/{s['runs']})"
               if "sections" in s else "-")
        flag = (f"{s['flagged_within_50']}/{s['runs']} <= 50: " + ", ".join(str(x) for x in s["steps_to_flag"])
                if "steps_to_flag" in s else "-")
        lines.append(f"| {s['case']} | {s['runs']} ({s['jobs']}) | {s['right']}/{s['runs']} | {', '.join(s['labels'])} "
                     f"| {sec} | {flag} | {s['false_alarms']} | {s.get('host_lag', 0)} | {round(statistics.median(steps), 1) if steps else '-'} "
                     f"| {s.get('startup_s_median', '-')} |")
    return "\n".join(lines)


# -- overhead ------------------------------------------------------------------------------------
def musubi_rate(job_dir: Path, batch: int, world: int) -> dict[str, Any]:
    """samples/s between rank 0's log records at OVH_WARMUP and OVH_STOP (metrics.jsonl)."""
    recs = [json.loads(ln) for ln in (job_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if ln]
    times = {r["step"]: r["time"] for r in recs if r.get("kind") == "train"}
    if OVH_WARMUP not in times or OVH_STOP not in times:
        raise RuntimeError(f"log steps {OVH_WARMUP} and {OVH_STOP} missing: {sorted(times)}")
    dt = times[OVH_STOP] - times[OVH_WARMUP]
    steps = OVH_STOP - OVH_WARMUP
    return {"samples_per_s": round(batch * world * steps / dt, 1), "mean_step_ms": round(dt / steps * 1e3, 3)}


def run_plain(ref: Path, nproc: int, batch: int) -> dict[str, Any]:
    """plain_ddp.py resnet50 in `wall` mode under torchrun."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(ref / "plain_ddp.py"), "resnet50", str(batch), str(PLAIN_STEPS), "wall"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"plain_ddp failed ({res.returncode}): {res.stderr[-2000:]}")
    line = next(ln for ln in reversed(res.stdout.splitlines()) if ln.strip().startswith("{"))
    return json.loads(line)


def run_overhead(args: argparse.Namespace, work: Path, result: dict[str, Any], save: Any) -> None:
    """musubi on / off / plain wall, interleaved (the order rotates each repeat)."""
    device = "cpu" if args.cpu else "cuda"
    if args.cpu:
        job, sets, batch = jobs(True, work)["main"][0], (), 8
    else:
        job, sets, batch = REPO / "examples/resnet50-bench.yaml", (), 256
    modes = ["on", "off"] + ([] if args.cpu or args.ref is None else ["plain"])
    if not args.cpu and args.ref is None:
        print("no --ref: plain_ddp.py wall mode skipped", flush=True)
    runs: list[dict[str, Any]] = result.setdefault("overhead_runs", [])
    for i in range(args.repeat):
        k = i % len(modes)
        for mode in modes[k:] + modes[:k]:
            if time.monotonic() > args.deadline:
                runs.append({"mode": mode, "repeat": i, "error": "skipped (--deadline-s spent)"})
                continue
            try:
                if mode == "plain":
                    r = run_plain(args.ref, args.nproc, batch)
                    rate = {"samples_per_s": r["samples_per_s"], "mean_step_ms": r["mean_step_ms"]}
                else:
                    out = work / f"ovh-{mode}-{i}"
                    shutil.rmtree(out, ignore_errors=True)
                    jd, _ = drills.train_once(job, out, args.nproc, device, OVH_STOP, "",
                                              (*sets, f"telemetry.enabled={'true' if mode == 'on' else 'false'}",
                                               "train.log_every=10", "checkpoint.enabled=false"),
                                              timeout_s=args.run_timeout_s)
                    rate = musubi_rate(jd, batch, args.nproc)
                    shutil.rmtree(out, ignore_errors=True)
            except (RuntimeError, subprocess.TimeoutExpired, StopIteration) as e:
                runs.append({"mode": mode, "repeat": i, "error": str(e)[-1500:]})
                print(json.dumps({"mode": mode, "repeat": i, "error": str(e)[-300:]}), flush=True)
                save()
                continue
            runs.append({"mode": mode, "repeat": i, **rate})
            print(json.dumps(runs[-1]), flush=True)
            save()
    med = {m: statistics.median([r["samples_per_s"] for r in runs if r.get("mode") == m and "samples_per_s" in r])
           for m in modes if any(r.get("mode") == m and "samples_per_s" in r for r in runs)}
    s: dict[str, Any] = {"world": args.nproc, "device": device, "per_gpu_batch": batch, "samples_per_s": med}
    if "on" in med and "off" in med:
        s["telemetry_overhead_pct"] = round(100 * (med["off"] / med["on"] - 1), 2)
    for m in ("on", "off"):
        if m in med and "plain" in med:
            s[f"musubi_{m}_vs_plain_wall"] = round(med[m] / med["plain"], 4)
    result["overhead"] = s


def main() -> None:
    """Parse, run the parts, write the JSON, print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="rehearsal on CPU: 2 gloo ranks, tiny sizes")
    ap.add_argument("--part", default="all", choices=["scenarios", "overhead", "all"])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (GPUs): 4 on the lent machine")
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--runs", type=int, default=2, help="runs per case (interleaved)")
    ap.add_argument("--steps", type=int, default=STEPS, help="steps per scenario run")
    ap.add_argument("--light-duty", type=float, default=0.25, help="gpu_hog_light: share of time the hog is busy")
    ap.add_argument("--repeat", type=int, default=2, help="overhead: runs per mode (interleaved)")
    ap.add_argument("--ref", type=Path, default=None, help="folder holding plain_ddp.py (GPU overhead)")
    ap.add_argument("--segments", type=int, default=1,
                    help="judge each job in this many segments of --steps steps (one start-up, several verdicts)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="scenario runs not started after this many s")
    ap.add_argument("--deadline-s", type=float, default=540.0,
                    help="no run (scenario or overhead) started after this many s from the start")
    ap.add_argument("--run-timeout-s", type=float, default=240.0)
    ap.add_argument("--keep-report", type=Path, default=None, help="write report.html of gpu_hog/cpu_hog run 0 here")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--hog-gpu", nargs=3, metavar=("DEVICE", "DUTY", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.segments < 1 or args.steps < WINDOW + WARMUP:
        ap.error(f"--segments must be >= 1 and --steps >= {WINDOW + WARMUP} (a judged window after the warm-up)")
    args.deadline = time.monotonic() + args.deadline_s
    if args.hog_gpu:
        hog_gpu(args.hog_gpu[0], float(args.hog_gpu[1]), int(args.hog_gpu[2]))
        return
    if args.ref is not None and not (args.ref / "plain_ddp.py").is_file():
        raise SystemExit(f"--ref {args.ref}: no plain_ddp.py there; copy ../shared/reference/ to it")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (shared hosts)
    work = Path(tempfile.mkdtemp(prefix="musubi-watchtower-"))
    result: dict[str, Any] = {"device": "cpu" if args.cpu else "cuda", "world": args.nproc,
                              "date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:]}
    try:
        import torch

        result["torch"] = torch.__version__
        if not args.cpu and torch.cuda.is_available():
            result["cards"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        result["commit"] = commit()
    except Exception:
        pass

    def save() -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")

    t0 = time.monotonic()
    try:
        if args.part in ("scenarios", "all"):
            run_scenarios(args, work, result, save)
            result["scenarios_s"] = round(time.monotonic() - t0, 1)
            save()
            print(f"\nscenarios ({result['scenarios_s']} s, {args.nproc} ranks, {result['device']}):")
            print(markdown(result["scenario_summary"]))
        if args.part in ("overhead", "all"):
            t1 = time.monotonic()
            run_overhead(args, work, result, save)
            result["overhead_s"] = round(time.monotonic() - t1, 1)
            save()
            print(f"\noverhead ({result['overhead_s']} s): {json.dumps(result['overhead'])}")
    finally:
        save()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
