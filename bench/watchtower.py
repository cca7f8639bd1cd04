"""Watchtower bench: the live straggler watch against REAL causes, and telemetry's cost against plain DDP.

Scenarios (`--part scenarios`), each a `musubi train` on --nproc ranks (4 on the lent machine) pinned to
equal shares of the machine's cores (MUSUBI_CPUS, as Musubi pins ranks); every cause hits rank 1:

- healthy          - resnet50 bs256 bf16 channels_last (examples/resnet50-bench.yaml, the reference step):
                     GPU bound, not launch bound (session 7's bs128 had SM active 57-78 % and its host jitter
                     flagged 4 of 10 segments); expect `healthy compute bound`, no flag.
- gpu_hog          - the same job; a second CUDA process runs back-to-back bf16 matmuls on rank 1's GPU only
                     (time-sliced with the job: a slower GPU, not a sleep); expect straggler rank 1 in
                     forward/backward. `gpu_hog_light` (opt-in): the hog busy --light-duty (0.1) of the
                     time: the job 10.6 % slower, rank 1's own work 3.3-5.8 %
                     (4x H200, 2026-11-27; time-slicing delays its collectives too), under the bar; at 0.2 ~9.4 %.
                     `gpu_slow10` (opt-in): MUSUBI_INJECT slow:rank=1,factor=1.1, real matrix products.
- cpu_hog          - resnet50 bs128 fed by CPU loader workers (synthetic images made on the CPU, workers sized
                     for LOADER_HEADROOM x what the GPU eats at the healthy step) and CPU_HOG_PER_CORE
                     spinning processes pinned to rank 1's cores; expect straggler rank 1, section data: input
                     starved by CPU contention. `healthy_cpu_data` (opt-in): its control.
- p2p_off          - NCCL_P2P_DISABLE=1 for the job (NCCL falls back to SHM through host memory) on a GPT
                     made to be communication bound (COMM_GPT): expect `communication bound`.
                     `healthy_comm` (opt-in): the same job with P2P on.
- healthy_fcos     - (opt-in) fcos_resnet50_fpn bs16 (examples/fcos-bench.yaml); expect healthy.
- ckpt_sync        - (opt-in) CKPT_GPT with AdamW, a checkpoint every CKPT_EVERY steps, `async_mode: off`: the
                     step waits for the whole write and commit; expect `periodic checkpoint stall`.
- ckpt_async       - (opt-in) the same job, `async_mode: auto` (DCP's checkpoint process on GPUs, a writer
                     thread on CPU): the step waits only for the copy to host memory; expect healthy (the
                     table beside the verdicts gives each segment's checkpoint share and the saves' blocked
                     and durable seconds from metrics.jsonl). Both train warm segments first, judged and
                     kept (`warm`) but not counted, as many as hold the first two saves (Case.warm_segments):
                     the first asynchronous save starts the checkpoint process and the next waits for it.

The checkpoint cases on paper (CKPT_GPT: 4 layers x hidden 768, vocab 8192, seq 256, batch 384 = 98 k tokens a
rank): 4 x 12 x 768^2 = 28 M + 6 M embedding = 34 M parameters, 12 bytes each with AdamW = 0.41 GB saved per
rank. bench/checkpoint.py measured 3.05-3.85 s for a synchronous save of 1.918 GB per rank on 4 GPUs (H200,
H100, 2026-11-26), 1.6-2.0 s/GB: ~0.7-0.8 s here, and an asynchronous one durable after about as long and
blocking ~2.6 % of it. A step: 6 x 34 M x 98 k = 20 TFLOP a rank, 80-200 ms at 100-250 TFLOP/s; 12 steps
between saves are 1.0-2.4 s. Synchronous: 0.75 s of every 1.7-3.2 s, a checkpoint share of 0.25-0.45
(the label's bar CHECKPOINT_SHARE is 0.05). Asynchronous: the next save comes after the last is durable
(1.0-2.4 s > ~0.8 s; were it not, the wait is blocked time and the share shows it), ~0.02-0.04 s blocked
of 1.0-2.4 s, a share of ~0.01-0.04. Not the 1-2 B parameter model of a real stall (16-32 GB a rank, tens of
seconds a save): ten verdicts of such a job would not fit one call.

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
as host lag is neither), and host-lag notes; per job: where the wall time went (`time`).

Overhead (`--part overhead`): per model of `--models` (resnet50: examples/resnet50-bench.yaml bs256; fcos:
examples/fcos-bench.yaml bs16, the per-GPU batch read from the job file and given to plain_ddp.py) and GPU
count of `--nprocs`: `musubi train` with telemetry on, off, and `plain_ddp.py MODEL BATCH STEPS wall` (the
fair reference), interleaved (the modes rotate each repeat), samples/s over log steps 20-100 for resnet50,
20-120 for fcos (musubi, from metrics.jsonl) and 80 / 100 timed steps after 15 (plain). The most GPUs run
first, then each repeat of every model; a (model, nproc, repeat) group of runs is begun only when the whole
group fits before --deadline-s (OvhModel.est_s, then the runs' measured times), and after the first group
left out the rest are too. Per (model, nproc) the summary gives musubi_on_vs_plain_wall and
telemetry_overhead_pct. `--plan` prints the runs, what the deadline holds and the expected seconds.

GPU (4 GPUs), from the repo root: 10 verdicts of 30 steps per case, cases in the order healthy, p2p_off,
gpu_hog, cpu_hog; on 4x H200 (2026-11-26, 7b6de92) the first three took 52 + 43 + 72 s (steps 55 / 46 / 124
ms, start-ups 29-36 s), 174 s in all; cpu_hog took 82 s on 4x H200 (2026-11-27, d18e166), so it runs only
when the budget still holds the longest case's time. The JSON is rewritten after every case; a case is not begun when less time is left before
--budget-s than the longest case so far took:

    NCCL_NVLS_ENABLE=0 python3 bench/watchtower.py --part scenarios --nproc 4 --runs 1 --segments 10 \
        --steps 30 --budget-s 250 --deadline-s 265 --json $OUT/watchtower.json

Side by side (`--part overhead --side-by-side`): musubi (telemetry on) and plain DDP `wall` at once on disjoint
GPUs and equal disjoint shares of the cores, as many runs as the machine holds (4 at 1 GPU a run on 4 GPUs, 2 at
2), the programs swapping places every round (`--repeat` rounds); at 4 GPUs a run the two take turns. More runs
a device second, each pair under the same machine at the same time: two runs of one program differed by up to
11 % (fcos, 2x H200, 2026-11-27), so what settles 1 % is many runs, not long ones. Its windows are not aligned
(musubi starts ~10 s slower than plain), so a run partly overlaps its neighbour's start-up or end.

Done on 4x H200 by 2026-11-27 (BENCHMARKS.md sessions 10-16): healthy, gpu_hog, cpu_hog, p2p_off, healthy_fcos,
gpu_slow10 (twice), gpu_hog_light at a 0.2 duty, ckpt_async 10/10 each; ckpt_sync 9/9; gpu_hog_light at 0.1
0/10 flagged, its GPU named shared 10/10; telemetry's parts in one process (fcos at 4 GPUs: on -0.20 %, full
+0.91 %, watch +0.12 %). Against plain DDP `wall` (session 16, one call each): fcos 0.975x (4 GPUs, in turn),
0.990x (2), 0.993x (1); resnet50 0.969x (4), 0.995x (2); fcos at 4 GPUs with telemetry off 0.980x. Each resnet50
run at 4 GPUs had one 10-step interval 110-145 ms long, plain's pace otherwise. Left for issue 21 (two calls;
the seconds are --plan's, from the runs' measured times):

    # 1 (~552 s): where fcos's 4-GPU step loses 2 % with telemetry off, and resnet50's one-off stall: the runs
    # with telemetry on now record their slowest steps (`stalls`: every rank's time, the sections over median)
    python3 bench/watchtower.py --part overhead --models fcos,resnet50 --nprocs 4 --repeat 2 --ref .ref \
        --deadline-s 575 --json $OUT/ovh-x4.json
    # 2 (~552 s): the 1/2/4-GPU table of both models in one call, after the fix (1 GPU: one round)
    python3 bench/watchtower.py --part overhead --side-by-side --models resnet50,fcos --nprocs 4,2,1 --repeat 2 \
        --ref .ref --deadline-s 560 --json $OUT/sbs.json
    # and the GPU tier first if the fix changes code that runs on GPUs: make gpu-test GPU_TIER_ARGS="--budget-s 385"

The device returns at most 8 files from $OUT: pack the rest into one archive.

CPU rehearsal (2 gloo ranks, resnet18 at 16 px, fcos at 64 px, tiny GPTs; the GPU hog becomes a CPU matmul hog
on rank 1's core, plain DDP is skipped):

    python bench/watchtower.py --cpu --part scenarios --runs 1 --segments 2 --steps 30 --json /tmp/watchtower-cpu.json
    python bench/watchtower.py --cpu --part scenarios --cases ckpt_sync,ckpt_async --runs 1 --segments 2 --steps 60
    python bench/watchtower.py --cpu --part overhead --models resnet50,fcos --nprocs 2 --repeat 1

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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.provenance import commit  # noqa: E402
from bench.warm_up import warm_up  # noqa: E402
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
#: The checkpoint cases' GPT (the docstring works out its save and step): AdamW, DDP, a save every CKPT_EVERY
#: steps, so a segment of --steps >= 2 x CKPT_EVERY holds two saves (the label needs two). Measured on 4x H200
#: (2026-11-27, 2792591): a step 69.6 ms (not the 80-200 predicted), a synchronous save blocked 1.03 s, an
#: asynchronous one durable after 1.52 s. At a save every 12 steps (0.84 s) each asynchronous save waited for
#: the one before (blocked median 0.44 s, checkpoint share 0.22-0.33 a segment): the watchtower said "periodic
#: checkpoint stall" 10 of 10 times, rightly. Every 30 steps (2.1 s) the write has ~0.6 s to spare.
CKPT_GPT = {"model_args": {"layers": 4, "hidden": 768, "heads": 12},
            "synthetic": {"seq_len": 256, "vocab": 8192}, "batch": 384}
CKPT_GPT_CPU = {"model_args": {"layers": 2, "hidden": 256, "heads": 4},
                "synthetic": {"seq_len": 32, "vocab": 4096}, "batch": 4}
CKPT_EVERY = 30
#: Cases whose first job's report --keep-report writes (the real stragglers, and the shared GPU below the bar).
KEEP_REPORT = ("gpu_hog", "cpu_hog", "gpu_hog_light", "gpu_slow10")
#: Seconds a case takes on 4x H200 for 10 segments of 30 steps (the scenario budget's prior, until the case
#: has run): measured healthy 52, p2p_off 43, gpu_hog 72 (2026-11-26, 7b6de92), cpu_hog 82 (2026-11-27,
#: d18e166); ckpt_async 93.1 s for 11 x 60 steps (2026-11-27, 9a94a66: 34 s of it start-up and teardown), so 67
#: at this scale with the 3 warm segments of 30 steps that hold its first two saves; ckpt_sync that plus its ~1 s
#: blocked in each save; healthy_fcos more than 83 s: its first run, allowed 84 s (71 predicted from ~30 s
#: start-up + 300 x 138 ms), was stopped at the deadline (fcos starts slower: torchvision's detection model,
#: cuDNN autotuning at each FPN level). Scaled by the steps asked (start-up kept).
#: 2026-11-27 (4x H200, 6475bab): gpu_hog_light 48 s, healthy_fcos 79 s (the 100 s kept: its start-up varies).
CASE_EST_S = {"healthy": 52.0, "p2p_off": 43.0, "gpu_hog": 72.0, "gpu_hog_light": 55.0, "cpu_hog": 82.0,
              "gpu_slow10": 56.0, "healthy_cpu_data": 82.0, "healthy_comm": 43.0, "healthy_fcos": 100.0,
              "ckpt_sync": 80.0, "ckpt_async": 67.0}
CASE_STARTUP_S = 30.0
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
    sets: tuple[str, ...] = ()  # the case's own overrides (after the job's)
    #: saves trained through before the segments that count (a first asynchronous save starts DCP's checkpoint
    #: process, and the second save waits for that first one: not the steady state the case is about)
    warm_saves: int = 0
    #: MUSUBI_INJECT for the job (contract/inject.py): `slow` queues real matrix products on a GPU
    inject: str = ""

    def warm_segments(self, steps: int) -> int:
        """Leading segments of `steps` steps trained, judged and kept, but not counted: those that hold the
        first `warm_saves` saves. A save after step k is timed in step k + 1's record (the bookkeeping after a
        step belongs to the next one), so the second save every 30 steps lands in step 61: a first segment of 60
        steps does not hold it. On 4x H200 (2026-11-27) ckpt_async's first counted segment was a stall, one
        save blocked 8.0 s: most likely that one, waiting for the first while DCP's checkpoint process started
        (seen so on 2 CPU ranks in process mode: the second save blocked 1.25 s, in step 61's record)."""
        return math.ceil((self.warm_saves * CKPT_EVERY + 1) / steps) if self.warm_saves else 0


CASES = {c.name: c for c in (
    Case("healthy", "main", "", "healthy compute bound"),
    Case("gpu_hog", "main", "gpu_hog", "straggler", CULPRIT, ("forward", "backward", "optimizer")),
    Case("gpu_hog_light", "main", "gpu_hog_light", "straggler", CULPRIT, ("forward", "backward", "optimizer")),
    # The issue's "10 % slower GPU": rank 1's compute meant to be stretched by 10 % with real kernels on its
    # stream (the `slow` fault: 0.1 x its recent step of matrix products in backward, before the gradient sync),
    # the way a GPU with 10 % less throughput loses its time. On 4x H200 (2026-11-27, a97314f and e81c0f3) rank 1's
    # backward took 34.8-35.1 ms against the healthy run's 29.4 (+10 % of the step), but the waiting ranks'
    # backward grew 2.2 ms too, so its excess over them read 5.3-5.5 %. A co-tenant process is not that:
    # gpu_hog_light at a 0.1 duty made the job 10.6 % slower but rank 1's own work only 3.3-5.8 %: time-slicing
    # delays its collectives too, which shows as the other ranks waiting, not as its work.
    Case("gpu_slow10", "main", "", "straggler", CULPRIT, ("forward", "backward", "optimizer"),
         inject=f"slow:rank={CULPRIT},factor=1.1"),
    Case("healthy_cpu_data", "cpu_data", "", "healthy compute bound"),
    Case("cpu_hog", "cpu_data", "cpu_hog", "straggler", CULPRIT, ("data", "h2d")),
    Case("p2p_off", "comm", "p2p_off", "communication bound"),
    Case("healthy_comm", "comm", "", "healthy compute bound"),  # p2p_off's control: same batch, P2P on
    Case("healthy_fcos", "fcos", "", "healthy compute bound"),
    Case("ckpt_sync", "ckpt", "", "periodic checkpoint stall", warm_saves=2,
         sets=("checkpoint.enabled=true", f"checkpoint.every_steps={CKPT_EVERY}", "checkpoint.async_mode=off")),
    Case("ckpt_async", "ckpt", "", "healthy compute bound", warm_saves=2,
         sets=("checkpoint.enabled=true", f"checkpoint.every_steps={CKPT_EVERY}", "checkpoint.async_mode=auto")),
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
    ckpt = (a.get("figures") or {}).get("checkpoint") or {}
    if ckpt.get("share") is not None:
        ckpt = {**ckpt, "share": round(ckpt["share"], 4)}
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
        "checkpoint": {k: ckpt.get(k) for k in ("count", "mean_ms", "every_steps", "share")} if ckpt else None,
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
def gpt_job(work: Path, name: str, shape: dict[str, Any], cpu: bool, optimizer: str = "sgd") -> Path:
    """A GPT job file of `shape` (COMM_GPT, CKPT_GPT, ...), tokens made on the device."""
    # One epoch must hold every step asked for: at 1 M samples the checkpoint job (384 a rank x 4 ranks a step)
    # ended after 651 of 720 steps and its last segment was judged on nothing (4x H200, 2026-11-27). On-device
    # batches are made, not indexed, so the size costs nothing (the config allows at most 50 M).
    import yaml

    spec = {"name": name, "task": "lm", "model": "gpt", "model_args": shape["model_args"],
            "data": {"synthetic": {"train_size": 50_000_000, "val_size": 0, "on_device": True, **shape["synthetic"]}},
            "train": {"epochs": 1, "batch": shape["batch"], "lr": 1e-4, "base_batch": shape["batch"],
                      "optimizer": optimizer, "precision": "fp32" if cpu else "bf16", "log_every": 10},
            "checkpoint": {"enabled": False}}
    p = work / f"{name}.yaml"
    p.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return p


def jobs(cpu: bool, work: Path) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """Job file and overrides of each job kind."""
    comm = gpt_job(work, "comm", COMM_GPT if not cpu else {"model_args": {"layers": 2, "hidden": 64, "heads": 4},
                                                            "synthetic": {"seq_len": 32, "vocab": 512}, "batch": 4},
                   cpu)
    # AdamW: two moments a parameter, so the saved state is 12 bytes a parameter (fp32 weights + moments)
    ckpt = gpt_job(work, "ckpt", CKPT_GPT_CPU if cpu else CKPT_GPT, cpu, optimizer="adamw")
    if cpu:
        spec = {"name": "watch", "task": "classification", "model": "resnet18",
                "data": {"synthetic": {"train_size": 100_000, "val_size": 0, "image_size": 16, "num_classes": 10},
                         "workers": 0},
                "train": {"epochs": 1, "batch": 8, "lr": 0.05, "base_batch": 32, "log_every": 10},
                "checkpoint": {"enabled": False}}
        import yaml

        p = work / "watch.yaml"
        p.write_text(yaml.safe_dump(spec), encoding="utf-8")
        return {"main": (p, ()), "cpu_data": (p, ("data.workers=1",)), "comm": (comm, ()), "fcos": (p, ()),
                "ckpt": (ckpt, ())}
    r50 = REPO / "examples/resnet50-bench.yaml"
    return {"main": (r50, ()),  # bs256 bf16 channels_last: GPU bound
            "cpu_data": (r50, (f"train.batch={CPU_DATA_BATCH}", "data.synthetic.on_device=false")),
            "comm": (comm, ()),
            "fcos": (REPO / "examples/fcos-bench.yaml", ()),
            "ckpt": (ckpt, ())}


def case_estimate(name: str, args: argparse.Namespace) -> float:
    """Seconds a case not run yet is expected to take (CASE_EST_S scaled to the steps asked); 0 on CPU."""
    if args.cpu:
        return 0.0
    case = CASES[name]
    scale = args.steps * (case.warm_segments(args.steps) + args.segments) / (30 * (10 + case.warm_segments(30)))
    return round(CASE_STARTUP_S + (CASE_EST_S[name] - CASE_STARTUP_S) * scale, 1)


def checkpoint_saves(job_dir: Path) -> dict[str, Any] | None:
    """The job's saves as rank 0 recorded them (metrics.jsonl): mode, count, median blocked and durable seconds."""
    path = job_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    recs = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    recs = [r for r in recs if r.get("kind") == "checkpoint"]
    if not recs:
        return None

    def med(key: str) -> float | None:
        xs = [float(r[key]) for r in recs if r.get(key) is not None]
        return round(statistics.median(xs), 3) if xs else None

    return {"mode": recs[-1].get("mode"), "count": len(recs), "blocked_s_median": med("blocked_s"),
            "blocked_s_max": max((float(r.get("blocked_s") or 0) for r in recs), default=None),
            "durable_s_median": med("durable_s"), "failed": sum(r.get("ok") is False for r in recs)}


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
            if time.monotonic() + took.get(name, case_estimate(name, args)) > deadline:
                rows.append({"case": name, "run": i, "ok": False, "label": "skipped (--budget-s spent)"})
                continue
            began = time.monotonic()
            job, sets = js[case.job]
            sets = (*sets, "checkpoint.enabled=false", *case.sets)
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
            warm = case.warm_segments(args.steps)
            steps = args.steps * (warm + args.segments)
            try:
                hogs = start_hogs(case.cause, device, cpus, hog_index, args.light_duty, 2048 if args.cpu else 8192)
                left = args.deadline - time.monotonic()  # a run past the hard deadline is stopped
                job_dir, wall = drills.train_once(job, out, args.nproc, device, steps, case.inject, sets,
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
            # A case's warm segments come first, judged and kept (marked `warm`) but not counted.
            saves = checkpoint_saves(job_dir)
            for j in range(warm + args.segments):
                row = judge(case, job_dir, j * args.steps + 1, (j + 1) * args.steps)
                row.update(run=i, segment=j - warm, wall_s=round(wall, 1), sets=list(sets), env=env)
                if not row.get("steps"):  # judged on nothing: say why instead of a bare wrong label
                    row["error"] = (f"no step records for steps {j * args.steps + 1}-{(j + 1) * args.steps}: the "
                                    f"job ended early (an epoch shorter than the steps asked for?)")
                if j < warm:
                    row["warm"] = True
                if j == warm:
                    row["time"] = spent
                    if saves:
                        row["saves"] = saves
                if procs_seen is not None:
                    row["gpu_processes_on_culprit_gpu"] = procs_seen
                rows.append(row)
                print(json.dumps({k: row.get(k) for k in ("case", "run", "segment", "label", "ok", "flagged",
                                                          "section", "steps_to_flag", "false_alarms", "step_ms")}),
                      flush=True)
            print(json.dumps({"case": name, "run": i, "wall_s": round(wall, 1), **spent}), flush=True)
            if args.keep_report and name in KEEP_REPORT and i == 0:
                from musubi.diagnose.report import build_report

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
        warm = [r for r in rows if r["case"] == name and r.get("warm")]
        rs = [r for r in rows if r["case"] == name and not r.get("warm")]
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
        if any(r.get("checkpoint") and r["checkpoint"].get("count") for r in rs):
            s["checkpoint_share"] = [(r.get("checkpoint") or {}).get("share") for r in rs]
            s["saves"] = [r["saves"] for r in rs if r.get("saves")]
        if warm:
            s["warm_labels"] = [r.get("label") for r in warm]
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
    ck = [s for s in summary if "checkpoint_share" in s]
    if ck:
        lines += ["", "| case | checkpoint share of step time (per segment) | saves: mode, count, blocked s (median / max), "
                  "durable s (median) | warm segment's label |", "|---|---|---|---|"]
        for s in ck:
            sv = s["saves"][0] if s["saves"] else {}
            lines.append(f"| {s['case']} | {', '.join(f'{x:.3f}' if x is not None else '-' for x in s['checkpoint_share'])} "
                         f"| {sv.get('mode')}, {sv.get('count')}, {sv.get('blocked_s_median')} / {sv.get('blocked_s_max')}, "
                         f"{sv.get('durable_s_median')} | {', '.join(map(str, s.get('warm_labels', []))) or '-'} |")
    return "\n".join(lines)


# -- overhead ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OvhModel:
    """One model of the overhead part: its job, musubi's timed window, plain_ddp.py's, the expected run time."""

    job: str  # repo-relative job file (GPU); its train.batch is the per-GPU batch of both programs
    warm: int  # musubi's window: samples/s between rank 0's log records at these steps (log_every 10)
    stop: int
    plain_steps: int  # plain_ddp.py times this many steps after its own 15 warm-up steps
    est_s: float  # one run (musubi or plain) on 4x H200, start to end (OVH_MODELS says how it was found)


#: A run's seconds, start to end, before one of its (model, mode) has run here (then its measured time counts).
#: Musubi's runs, the longer of the two programs: on 4x H200 (2026-11-27, e81c0f3) resnet50 38.1-45.8 s (plain
#: 25.6-28.5), fcos 44.8-54.9 s (plain 34.6-41.4; one fcos run 64.4), at 1, 2 and 4 GPUs alike (weak scaling).
#: The figures before them (23 and 42 s, from 137.7 s for 6 resnet50 runs and an estimate) were short by a
#: third for musubi: the plan said 276 s for a side-by-side resnet50 table and the call skipped its 1-GPU runs.
#: fcos runs 100 steps (a 13.6 s window): with 40, two runs of one mode differed by 1.2-2.5 % (2x H200,
#: 2026-11-27, 40e01f5), more than the 1 % the criterion asks to tell.
OVH_MODELS = {
    "resnet50": OvhModel("examples/resnet50-bench.yaml", OVH_WARMUP, OVH_STOP, PLAIN_STEPS, 42.0),
    "fcos": OvhModel("examples/fcos-bench.yaml", 20, 120, 100, 50.0),
}
OVH_MODES = ("on", "off", "plain")


def ovh_cpu_jobs(work: Path) -> dict[str, tuple[Path, OvhModel]]:
    """CPU rehearsal sizes of the overhead models: resnet18 at 16 px, fcos at 64 px (2 gloo ranks, 2 cores)."""
    import yaml

    fcos = {"name": "fcos-tiny", "task": "detection", "model": "fcos_resnet50_fpn",
            "model_args": {"min_size": 64, "max_size": 64},
            "data": {"synthetic": {"train_size": 10_000, "val_size": 0, "image_size": 64, "num_classes": 3,
                                   "objects": 2, "min_object": 8, "max_object": 24}, "workers": 0},
            "train": {"epochs": 1, "batch": 1, "lr": 0.01, "base_batch": 2, "log_every": 10},
            "checkpoint": {"enabled": False}}
    p = work / "fcos-tiny.yaml"
    p.write_text(yaml.safe_dump(fcos), encoding="utf-8")
    return {"resnet50": (jobs(True, work)["main"][0], OvhModel("", OVH_WARMUP, OVH_STOP, 0, 0.0)),
            "fcos": (p, OvhModel("", 10, 30, 0, 0.0))}


def job_batch(job: Path) -> int:
    """The per-GPU batch of a job file (train.batch)."""
    import yaml

    return int(yaml.safe_load(job.read_text(encoding="utf-8"))["train"]["batch"])


@dataclass(frozen=True)
class OvhRun:
    """One overhead run: a program (musubi on/off or plain) on `nproc` GPUs."""

    model: str
    nproc: int
    repeat: int
    mode: str


def overhead_plan(models: list[str], nprocs: list[int], repeat: int, modes: tuple[str, ...]) -> list[OvhRun]:
    """Every run in the order they are made: most GPUs first (the figures the issue asks first), then each
    repeat of every model; within a (model, nproc, repeat) the modes rotate, so each mode runs first,
    in the middle and last as often (on / off / plain interleaved)."""
    out = []
    for n in sorted(set(nprocs), reverse=True):
        for i in range(repeat):
            for j, m in enumerate(models):
                k = (i + j) % len(modes)
                out += [OvhRun(m, n, i, mode) for mode in modes[k:] + modes[:k]]
    return out


def fit_plan(plan: list[OvhRun], est: dict[tuple[str, str], float], left_s: float) -> tuple[list[OvhRun], float]:
    """The runs a budget of `left_s` seconds holds, whole (model, nproc, repeat) groups only (an `on` without
    its `plain` compares nothing), in the plan's order up to the first group that does not fit (a later,
    shorter group is less important than the one left out); and their expected seconds."""
    kept, total = [], 0.0
    for g in plan_groups(plan):
        t = sum(est[(r.model, r.mode)] for r in g)
        if total + t > left_s:
            break
        kept += g
        total += t
    return kept, total


def plan_groups(plan: list[OvhRun]) -> list[list[OvhRun]]:
    """The plan's runs grouped by (model, nproc, repeat), in order."""
    groups: dict[tuple[str, int, int], list[OvhRun]] = {}
    for r in plan:
        groups.setdefault((r.model, r.nproc, r.repeat), []).append(r)
    return list(groups.values())


def musubi_rate(job_dir: Path, batch: int, world: int, warm: int = OVH_WARMUP, stop: int = OVH_STOP) -> dict[str, Any]:
    """samples/s between rank 0's log records at `warm` and `stop` (metrics.jsonl), and the mean step of each
    log interval between them: a run slower all through (its own cuDNN choices, a cost of every step) reads
    differently from one slowed for a while (another process, a clock dip). Two runs of one program differed by
    up to 11 % on 2x H200 (fcos, 2026-11-27); these say which kind of difference it was."""
    recs = [json.loads(ln) for ln in (job_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if ln]
    times = {r["step"]: r["time"] for r in recs if r.get("kind") == "train"}
    if warm not in times or stop not in times:
        raise RuntimeError(f"log steps {warm} and {stop} missing: {sorted(times)}")
    dt = times[stop] - times[warm]
    steps = stop - warm
    marks = sorted(k for k in times if warm <= k <= stop)
    intervals = [round((times[b] - times[a]) / (b - a) * 1e3, 2) for a, b in zip(marks, marks[1:], strict=False)]
    return {"samples_per_s": round(batch * world * steps / dt, 1), "mean_step_ms": round(dt / steps * 1e3, 3),
            "interval_step_ms": intervals}


#: A step of an overhead run counts as a stall when its slowest rank took this many times the window's median step.
STALL_RATIO = 1.5


def stalls(job_dir: Path, warm: int, stop: int, top: int = 3) -> list[dict[str, Any]]:
    """The `top` slowest steps in (warm, stop] of a run with telemetry on that took STALL_RATIO x the median
    step or more, each with every rank's step time and the sections that ran longest over that rank's median
    (GPU times where recorded, else the host's). On 4x H200 (2026-11-27) each resnet50 run had one 10-step log
    interval ~110-145 ms longer than the others, plain DDP's pace otherwise: this says which rank and section."""
    tele = load_job(job_dir)
    per_step: dict[int, dict[int, dict[str, Any]]] = {}
    for rank, recs in tele.steps.items():
        for r in recs:
            if warm < r["step"] <= stop and isinstance(r.get("wall_ms"), (int, float)):
                per_step.setdefault(r["step"], {})[rank] = r
    if not per_step:
        return []
    slowest = {k: max(float(v["wall_ms"]) for v in ranks.values()) for k, ranks in per_step.items()}
    median = statistics.median(slowest.values())

    def sections(r: dict[str, Any]) -> dict[str, float]:
        return {k: float(v) for k, v in (r.get("gpu") or r.get("host") or {}).items() if isinstance(v, (int, float))}

    medians: dict[int, dict[str, float]] = {}
    for rank in tele.steps:
        cols: dict[str, list[float]] = {}
        for ranks in per_step.values():
            if rank in ranks:
                for k, v in sections(ranks[rank]).items():
                    cols.setdefault(k, []).append(v)
        medians[rank] = {k: statistics.median(v) for k, v in cols.items()}
    out = []
    for step in sorted(slowest, key=slowest.__getitem__, reverse=True)[:top]:
        if slowest[step] < STALL_RATIO * median:
            break
        ranks = per_step[step]
        out.append({"step": step, "median_step_ms": round(median, 2),
                    "wall_ms": {r: round(float(v["wall_ms"]), 2) for r, v in sorted(ranks.items())},
                    "over_median_ms": {r: {k: round(x - medians[r].get(k, 0.0), 2) for k, x in sections(v).items()
                                           if x - medians[r].get(k, 0.0) >= 0.1 * median}
                                       for r, v in sorted(ranks.items())}})
    return out


def run_plain(ref: Path, nproc: int, batch: int, model: str = "resnet50", steps: int = PLAIN_STEPS,
              timeout_s: float = 600.0, env: dict[str, str] | None = None,
              cores: set[int] | None = None) -> dict[str, Any]:
    """plain_ddp.py MODEL in `wall` mode under torchrun (`env` added to ours; `cores`: pinned there, all of it)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(ref / "plain_ddp.py"), model, str(batch), str(steps), "wall"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})},
                         preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    if res.returncode != 0:
        raise RuntimeError(f"plain_ddp failed ({res.returncode}): {res.stderr[-2000:]}")
    line = next(ln for ln in reversed(res.stdout.splitlines()) if ln.strip().startswith("{"))
    return json.loads(line)


def summarize_overhead(runs: list[dict[str, Any]], device: str) -> list[dict[str, Any]]:
    """Per (model, nproc): median samples/s of each mode, telemetry's overhead and musubi vs plain `wall`."""
    out = []
    for model, n in dict.fromkeys((r.get("model", "resnet50"), r.get("world")) for r in runs):
        rs = [r for r in runs if r.get("model", "resnet50") == model and r.get("world") == n and "samples_per_s" in r]
        med = {m: statistics.median([r["samples_per_s"] for r in rs if r["mode"] == m])
               for m in OVH_MODES if any(r["mode"] == m for r in rs)}
        s: dict[str, Any] = {"model": model, "world": n, "device": device,
                             "per_gpu_batch": next((r["per_gpu_batch"] for r in rs), None),
                             "runs": {m: sum(r["mode"] == m for r in rs) for m in med}, "samples_per_s": med}
        if "on" in med and "off" in med:
            # the time telemetry adds to a step, as a share of the step without it
            s["telemetry_overhead_pct"] = round(100 * (med["off"] / med["on"] - 1), 2)
        for m in ("on", "off"):
            if m in med and "plain" in med:
                s[f"musubi_{m}_vs_plain_wall"] = round(med[m] / med["plain"], 4)
        out.append(s)
    return out


def run_overhead(args: argparse.Namespace, work: Path, result: dict[str, Any], save: Any) -> None:
    """musubi on / off / plain `wall` per (model, nproc), interleaved, the runs the deadline holds."""
    device = "cpu" if args.cpu else "cuda"
    cpu_jobs = ovh_cpu_jobs(work) if args.cpu else {}
    spec = {m: cpu_jobs[m] if args.cpu else (REPO / OVH_MODELS[m].job, OVH_MODELS[m]) for m in args.models}
    modes = OVH_MODES if not (args.cpu or args.ref is None) else OVH_MODES[:2]
    if not args.cpu and args.ref is None:
        print("no --ref: plain_ddp.py wall mode skipped", flush=True)
    plan = overhead_plan(args.models, args.nprocs, args.repeat, modes)
    est = {(m, mode): OVH_MODELS[m].est_s for m in args.models for mode in modes}
    result["overhead_plan"] = [{"model": r.model, "world": r.nproc, "repeat": r.repeat, "mode": r.mode,
                                "est_s": est[(r.model, r.mode)]} for r in plan]
    runs: list[dict[str, Any]] = result.setdefault("overhead_runs", [])
    if not args.cpu:  # the first timed run on a fresh machine was 3.3 % slower than its repeat (bench/warm_up.py)
        t0 = time.monotonic()
        warm_up(device, max(args.nprocs))
        result["warm_up_s"] = round(time.monotonic() - t0, 1)
    stopped = False
    for group in plan_groups(plan):
        # A (model, nproc, repeat) group is begun only when all of it fits before the deadline, with the
        # estimates of now (a measured run replaces its prior): an `on` without its `plain` compares nothing.
        # After the first group left out, the rest are too (the plan's order is the order of importance).
        need = sum(est[(x.model, x.mode)] for x in group)
        stopped = stopped or time.monotonic() + need > args.deadline
        if stopped:
            runs += [{"model": x.model, "world": x.nproc, "mode": x.mode, "repeat": x.repeat,
                      "error": f"skipped (--deadline-s: {need:.0f} s expected)"} for x in group]
            print(json.dumps(runs[-1]), flush=True)
            continue
        for r in group:
            run_one_overhead(args, r, spec[r.model], device, work, est, runs)
            result["overhead"] = summarize_overhead(runs, device)
            save()
    result["overhead"] = summarize_overhead(runs, device)


def run_one_overhead(args: argparse.Namespace, r: OvhRun, spec: tuple[Path, OvhModel], device: str, work: Path,
                     est: dict[tuple[str, str], float], runs: list[dict[str, Any]]) -> None:
    """One overhead run; its row (or error) into `runs`, its time into `est`."""
    job, m = spec
    row = measure(args, r.model, r.nproc, r.mode, job, m, device, work / f"ovh-{r.model}-{r.nproc}-{r.mode}-{r.repeat}")
    row = {"model": r.model, "world": r.nproc, "mode": r.mode, "repeat": r.repeat, **row}
    runs.append(row)
    if "error" in row:
        print(json.dumps({k: row[k] for k in ("model", "world", "mode", "repeat")} | {"error": row["error"][-300:]}),
              flush=True)
        return
    est[(r.model, r.mode)] = row["wall_s"]
    print(json.dumps(row), flush=True)


def measure(args: argparse.Namespace, model: str, n: int, mode: str, job: Path, m: OvhModel, device: str, out: Path,
            env: dict[str, str] | None = None, cpus: tuple[str, ...] = ()) -> dict[str, Any]:
    """One timed run of `mode` (musubi with telemetry on/off, or plain_ddp.py `wall`) on `n` GPUs: its rate,
    window and wall seconds, or its error. `env` is added to the run's environment; `cpus`, one cpulist a rank,
    pins it (MUSUBI_CPUS for musubi, their union for plain_ddp.py)."""
    batch = job_batch(job)
    began = time.monotonic()
    timeout = max(30.0, min(args.run_timeout_s, args.deadline - began))  # a run past the deadline is stopped
    try:
        if mode == "plain":
            cores = {c for cl in cpus for c in _cpus(cl)} or None
            p = run_plain(args.ref, n, batch, model, m.plain_steps, timeout, env=env, cores=cores)
            rate = {"samples_per_s": p["samples_per_s"], "mean_step_ms": p["mean_step_ms"]}
            window = [15, 15 + m.plain_steps]
        else:
            shutil.rmtree(out, ignore_errors=True)
            jd, _ = drills.train_once(job, out, n, device, m.stop, "",
                                      (f"telemetry.enabled={'true' if mode == 'on' else 'false'}",
                                       "train.log_every=10", "checkpoint.enabled=false"),
                                      timeout_s=timeout,
                                      env_extra={**(env or {}), **({"MUSUBI_CPUS": ";".join(cpus)} if cpus else {})})
            rate = musubi_rate(jd, batch, n, m.warm, m.stop)
            if mode == "on":
                rate["stalls"] = stalls(jd, m.warm, m.stop)
            window = [m.warm, m.stop]
            shutil.rmtree(out, ignore_errors=True)
    except (RuntimeError, subprocess.TimeoutExpired, StopIteration) as e:
        return {"error": str(e)[-1500:]}
    return {"per_gpu_batch": batch, "window": window, **rate, "wall_s": round(time.monotonic() - began, 1)}


# -- overhead, side by side ---------------------------------------------------------------------
@dataclass(frozen=True)
class Slot:
    """One run of a side-by-side round: its mode, the GPUs it sees, and its ranks' cores."""

    mode: str
    gpus: tuple[int, ...]
    cpus: tuple[str, ...]  # one cpulist a rank (MUSUBI_CPUS for musubi; their union pins plain_ddp.py)


def side_by_side(nproc: int, gpus: int, round_: int, modes: tuple[str, str] = ("on", "plain"),
                 cores: list[str] | None = None) -> list[Slot]:
    """The runs of one round at `nproc` GPUs a run: as many as the machine's `gpus` hold, on disjoint GPUs and
    equal disjoint shares of the cores, the two modes alternating over the slots and swapping places every
    round, so each program meets each slot as often. One slot (nproc = gpus): both modes, one after the other,
    the first swapping every round."""
    slots = max(1, gpus // nproc)
    cores = cores if cores is not None else rank_cpus(slots * nproc)  # `cores`: one cpulist a rank of all slots
    first, second = modes if round_ % 2 == 0 else modes[::-1]
    if slots == 1:
        return [Slot(m, tuple(range(nproc)), tuple(cores)) for m in (first, second)]
    return [Slot(first if s % 2 == 0 else second, tuple(range(s * nproc, (s + 1) * nproc)),
                 tuple(cores[s * nproc:(s + 1) * nproc])) for s in range(slots)]


def rounds(args: argparse.Namespace, gpus: int, modes: tuple[str, str],
           cores: list[str] | None = None) -> Iterator[tuple[int, int, str, list[Slot]]]:
    """(GPUs a run, round, model, its slots) of every side-by-side round, in order: most GPUs first; the models
    start the programs' alternation at different places."""
    for n in sorted(set(args.nprocs), reverse=True):
        for i in range(args.repeat):
            for model in args.models:
                yield n, i, model, side_by_side(n, gpus, i + args.models.index(model), modes, cores)


def concurrent(slots: list[Slot]) -> bool:
    """Whether a round's runs go side by side (disjoint GPUs), not one after the other (one slot)."""
    return len({s.gpus for s in slots}) == len(slots)


def round_seconds(model: str, prior: float, slots: list[Slot], est: dict[tuple[str, str], float]) -> float:
    """Expected seconds of a round: its longest run, or with one slot the runs in turn, their sum (each run's
    (model, mode) time measured so far, else `prior`)."""
    return (max if concurrent(slots) else sum)(est.get((model, s.mode), prior) for s in slots)


def run_side_by_side(args: argparse.Namespace, work: Path, result: dict[str, Any], save: Any) -> None:
    """musubi (telemetry on) against plain DDP `wall` in runs side by side (`--side-by-side`): more runs a
    device second than one at a time, and each pair under the same machine at the same time. Two runs of one
    program differed by up to 11 % (fcos, 2x H200, 2026-11-27): what settles 1 % is many runs, not long ones."""
    device = "cpu" if args.cpu else "cuda"
    cpu_jobs = ovh_cpu_jobs(work) if args.cpu else {}
    modes: tuple[str, str] = ("on", "off") if args.cpu or args.ref is None else ("on", "plain")
    gpus = 2 if args.cpu else args.gpus or gpu_count()  # on CPU two one-core "slots" rehearse the same code
    runs: list[dict[str, Any]] = result.setdefault("overhead_runs", [])
    result["side_by_side"] = {"gpus": gpus, "modes": list(modes), "rounds": args.repeat}
    if not args.cpu:
        t0 = time.monotonic()
        warm_up(device, gpus)
        result["warm_up_s"] = round(time.monotonic() - t0, 1)
    est: dict[tuple[str, str], float] = {}
    for n, i, model, slots in rounds(args, gpus, modes):
        job, m = cpu_jobs[model] if args.cpu else (REPO / OVH_MODELS[model].job, OVH_MODELS[model])
        together = concurrent(slots)
        need = round_seconds(model, m.est_s, slots, est)
        if time.monotonic() + need > args.deadline:
            runs.append({"model": model, "world": n, "repeat": i, "error": f"skipped (--deadline-s: {need:.0f} s expected)"})
            print(json.dumps(runs[-1]), flush=True)
            continue
        with ThreadPoolExecutor(len(slots) if together else 1) as pool:
            rows = list(pool.map(partial(run_slot, args, model, n, i, job, m, device, work), slots))
        for row in rows:
            if "wall_s" in row:
                est[(model, row["mode"])] = row["wall_s"]
            runs.append(row)
            print(json.dumps(row), flush=True)
        result["overhead"] = summarize_overhead(runs, device)
        save()
    result["overhead"] = summarize_overhead(runs, device)


def run_slot(args: argparse.Namespace, model: str, n: int, i: int, job: Path, m: OvhModel, device: str, work: Path,
             s: Slot) -> dict[str, Any]:
    """One run of a side-by-side round on its slot's GPUs and cores; its row (or error)."""
    env = {} if device == "cpu" else {"CUDA_VISIBLE_DEVICES": ",".join(map(str, s.gpus))}
    row = measure(args, model, n, s.mode, job, m, device, work / f"sbs-{model}-{n}-{s.mode}-{i}-{s.gpus[0]}", env,
                  s.cpus)
    return {"model": model, "world": n, "mode": s.mode, "repeat": i, "gpus": list(s.gpus), "cpus": list(s.cpus),
            **row}


def gpu_count() -> int:
    """GPUs this machine has (torch counts them through NVML without starting CUDA); 1 without any."""
    import torch

    return max(1, torch.cuda.device_count())


def print_plan(args: argparse.Namespace) -> None:
    """The part's runs in order with their expected seconds on 4x H200, and which the deadline holds."""
    if args.part in ("overhead", "all") and args.side_by_side:
        total, gpus = 0.0, args.gpus or (gpu_count() if not args.cpu else 2)
        for n, i, model, slots in rounds(args, gpus, ("on", "plain"), cores=["-"] * gpus):  # no cores read
            t = round_seconds(model, OVH_MODELS[model].est_s, slots, {})
            fits = total + t <= args.deadline_s
            total += t if fits else 0.0
            print(f"side by side {model:9s} {n} GPU(s) round {i}: "
                  + ", ".join(f"{s.mode} on GPUs {','.join(map(str, s.gpus))}" for s in slots)
                  + f"  {t:5.1f} s{'' if fits else '  (skipped: past --deadline-s)'}")
        print(f"side by side: {total:.0f} s expected on {gpus} GPUs (--deadline-s {args.deadline_s:g})")
    elif args.part in ("overhead", "all"):
        modes = OVH_MODES if args.ref is not None else OVH_MODES[:2]
        plan = overhead_plan(args.models, args.nprocs, args.repeat, modes)
        est = {(m, mode): OVH_MODELS[m].est_s for m in args.models for mode in modes}
        kept, total = fit_plan(plan, est, args.deadline_s)
        for r in plan:
            print(f"overhead {r.model:9s} {r.nproc} GPU(s) repeat {r.repeat} {r.mode:5s} {est[(r.model, r.mode)]:5.1f} s"
                  f"{'' if r in kept else '  (skipped: past --deadline-s)'}")
        print(f"overhead: {len(kept)} of {len(plan)} runs, {total:.0f} s expected (--deadline-s {args.deadline_s:g})")
    if args.part in ("scenarios", "all"):
        total = 0.0
        for name in [n for n in args.cases.split(",") if n]:
            t = case_estimate(name, args) * args.runs
            fits = total + t <= min(args.budget_s, args.deadline_s)
            total += t if fits else 0.0
            segs = CASES[name].warm_segments(args.steps) + args.segments
            print(f"scenario {name:14s} {args.runs} run(s) x {segs} segments of "
                  f"{args.steps} steps {t:5.1f} s{'' if fits else '  (skipped: past --budget-s)'}")
        print(f"scenarios: {total:.0f} s expected (--budget-s {args.budget_s:g}, --deadline-s {args.deadline_s:g})")


def main() -> None:
    """Parse, run the parts, write the JSON, print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="rehearsal on CPU: 2 gloo ranks, tiny sizes")
    ap.add_argument("--part", default="all", choices=["scenarios", "overhead", "all"])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (GPUs): 4 on the lent machine")
    ap.add_argument("--nprocs", default=None,
                    help="overhead: comma-separated GPU counts, most GPUs run first (default: --nproc)")
    ap.add_argument("--models", default="resnet50", help=f"overhead: comma-separated, of: {', '.join(OVH_MODELS)}")
    ap.add_argument("--plan", action="store_true",
                    help="print the runs the deadline holds and their expected seconds (4x H200 figures); run nothing")
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--runs", type=int, default=2, help="runs per case (interleaved)")
    ap.add_argument("--steps", type=int, default=STEPS, help="steps per scenario run")
    # 0.1: the hog's 4 matmuls, then 9x as long asleep. On 4x H200 (2026-11-27) it made the job 10.6 % slower but
    # rank 1's own work only 3.3-5.8 % (time-slicing delays its collectives too): under the 5 % bar, not flagged.
    # 0.2 made rank 1's work ~9.4 % slower: flagged 10 of 10.
    ap.add_argument("--light-duty", type=float, default=0.1, help="gpu_hog_light: share of time the hog is busy")
    ap.add_argument("--repeat", type=int, default=2, help="overhead: runs per mode (interleaved)")
    ap.add_argument("--gpus", type=int, default=None, help="--side-by-side: GPUs to use (default: all NVML sees)")
    ap.add_argument("--side-by-side", action="store_true",
                    help="overhead: musubi (telemetry on) and plain DDP wall in runs side by side on disjoint GPUs and "
                         "cores, as many as the machine holds, swapping places every round (--repeat rounds)")
    ap.add_argument("--ref", type=Path, default=None, help="folder holding plain_ddp.py (GPU overhead)")
    ap.add_argument("--segments", type=int, default=1,
                    help="judge each job in this many segments of --steps steps (one start-up, several verdicts)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="scenario runs not started after this many s")
    ap.add_argument("--deadline-s", type=float, default=540.0,
                    help="no run (scenario or overhead) started after this many s from the start")
    ap.add_argument("--run-timeout-s", type=float, default=240.0)
    ap.add_argument("--keep-report", type=Path, default=None,
                    help=f"write report.html of run 0 of {', '.join(KEEP_REPORT)} here")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--hog-gpu", nargs=3, metavar=("DEVICE", "DUTY", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.segments < 1 or args.steps < WINDOW + WARMUP:
        ap.error(f"--segments must be >= 1 and --steps >= {WINDOW + WARMUP} (a judged window after the warm-up)")
    if args.part != "overhead" and any(CASES[n].job == "ckpt" for n in args.cases.split(",") if n in CASES) \
            and args.steps < 2 * CKPT_EVERY:
        ap.error(f"--steps {args.steps}: the checkpoint cases save every {CKPT_EVERY} steps and judge two saves a "
                 f"segment; use --steps {2 * CKPT_EVERY} or more")
    args.models = [m for m in args.models.split(",") if m]
    bad = [m for m in args.models if m not in OVH_MODELS]
    if bad or not args.models:
        ap.error(f"--models {','.join(bad) or '(empty)'}: choose from {', '.join(OVH_MODELS)}")
    try:
        args.nprocs = [int(n) for n in (args.nprocs or str(args.nproc)).split(",") if n]
    except ValueError:
        ap.error(f"--nprocs {args.nprocs!r}: give GPU counts separated by commas, e.g. 4,2,1")
    if not args.nprocs or min(args.nprocs) < 1:
        ap.error(f"--nprocs {args.nprocs}: give GPU counts >= 1, e.g. 4,2,1")
    args.deadline = time.monotonic() + args.deadline_s
    if args.plan:
        print_plan(args)
        return
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
            (run_side_by_side if args.side_by_side else run_overhead)(args, work, result, save)
            result["overhead_s"] = round(time.monotonic() - t1, 1)
            save()
            print(f"\noverhead ({result['overhead_s']} s):")
            for s in result["overhead"]:
                print(json.dumps(s))
    finally:
        save()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
