"""Fleet makespan: `musubi run` against (a) every job alone on one GPU in sequence and
(b) the seed's way, every job in sequence on all GPUs (single-GPU-only jobs alone).

    python bench/fleet.py [--fleet bench/fleet-bench.yaml] [--modes fleet,a,b] [--device cuda|cpu]
                          [--cpu-slots N] [--json OUT.json]

The same jobs (same data, epochs and per-rank batch) run in every mode; the
fleet packs them onto the GPUs side by side. The fleet's makespan also holds
each job's evaluation step (FPS, metrics) and the export/registration at the
end, which (a) and (b) skip: the comparison is conservative for the fleet.
Plumbing checked on CPU slots with tiny jobs (where start-up and evaluation
dominate, so the ratio says nothing); the 4-GPU run is still to be made. Prints the makespans, the speedup
of the fleet over (a) (target: at least 0.90 x the number of GPUs) and over (b).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from musubi.config.fleet import CommandJob, TaskJob  # noqa: E402
from musubi.config.load import load_fleet  # noqa: E402
from musubi.fleet.jobs import resolve_command  # noqa: E402


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """Seconds one command took; raises when it fails."""
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{argv[:6]} failed ({res.returncode}):\n{res.stdout[-1500:]}\n{res.stderr[-1500:]}")
    return time.perf_counter() - t0


def run_fleet(fleet: Path, out: Path, device: str, slots: int | None) -> float:
    """The fleet's makespan (training, evaluation and shipping included)."""
    argv = [sys.executable, "-m", "musubi.cli", "run", str(fleet), "--out", str(out), "--device", device,
            "--no-check"]
    if slots:
        argv += ["--cpu-slots", str(slots)]
    return _run(argv, dict(os.environ), REPO)


def run_job_alone(job, base: Path, out: Path, device: str, n: int, gpu: str | None) -> float:
    """Seconds of one job run alone on `n` GPUs (`gpu`: the one GPU index for single-GPU runs)."""
    env = dict(os.environ)
    if gpu is not None and device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if isinstance(job, TaskJob):
        path = out / f"{job.name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(job.spec.resolved()))
        argv = [sys.executable, "-m", "musubi.cli", "train", str(path), "--nproc", str(n), "--out",
                str(out / job.name), "--device", device, "--no-check"]
        return _run(argv, env, REPO)
    assert isinstance(job, CommandJob)
    job_dir = out / job.name
    job_dir.mkdir(parents=True, exist_ok=True)
    env.update(job.env, MUSUBI_JOB_DIR=str(job_dir))
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = gpu or "0"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return _run(resolve_command(job, base), env, job_dir)


def run_sequential(fleet: Path, out: Path, device: str, gpus_all: int, all_gpus: bool,
                   durations: dict[str, float], single_known: dict[str, float] | None = None) -> float:
    """Each job alone, one after another: on one GPU (a), or on all GPUs for distributable jobs (b).

    `single_known`: (a)'s times, reused in (b) for the single-GPU-only jobs, which (b) runs exactly
    as (a) does (alone on one GPU): measuring them twice would only spend device time."""
    spec = load_fleet(fleet)
    base = fleet.resolve().parent
    for job in spec.jobs:
        n = gpus_all if (all_gpus and isinstance(job, TaskJob)) else 1
        if n == 1 and all_gpus and single_known and job.name in single_known:
            durations[job.name] = single_known[job.name]
            continue
        durations[job.name] = run_job_alone(job, base, out, device, n, None)
    return sum(durations.values())


def run_solo_parallel(fleet: Path, out: Path, device: str, slots: int, durations: dict[str, float]) -> float:
    """(a) measured `slots` jobs at a time, each alone on its own GPU; the makespan of (a) is the SUM of
    the jobs' times (what running them one after another on one GPU takes). Saves device time; the
    jobs share the host's CPUs, so if anything this makes (a) slower, never faster."""
    spec = load_fleet(fleet)
    base = fleet.resolve().parent
    free: queue.Queue[str] = queue.Queue()
    for i in range(slots):
        free.put(str(i))

    def one(job) -> tuple[str, float]:
        gpu = free.get()
        try:
            return job.name, run_job_alone(job, base, out, device, 1, gpu)
        finally:
            free.put(gpu)

    with ThreadPoolExecutor(max_workers=slots) as pool:
        for name, seconds in pool.map(one, spec.jobs):
            durations[name] = seconds
    return sum(durations.values())


def main() -> None:
    """Run the selected modes and print the comparison."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleet", type=Path, default=REPO / "bench" / "fleet-bench.yaml")
    ap.add_argument("--modes", default="fleet,a,b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cpu-slots", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--a-parallel", action="store_true",
                    help="measure (a) as jobs alone on separate GPUs at once; (a) = the sum of their times")
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if args.device == "cuda":
        import torch

        n = torch.cuda.device_count()
    else:
        n = args.cpu_slots or 2
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    result: dict[str, float] = {}
    jobs: dict[str, dict[str, float]] = {}
    for mode in args.modes.split(","):
        jobs[mode] = {}
        if mode == "fleet":
            result[mode] = run_fleet(args.fleet, tmp / "fleet", args.device, args.cpu_slots)
        elif mode == "a" and args.a_parallel:
            result[mode] = run_solo_parallel(args.fleet, tmp / "a", args.device, n, jobs[mode])
        elif mode == "a":
            result[mode] = run_sequential(args.fleet, tmp / "a", args.device, n, False, jobs[mode])
        elif mode == "b":
            result[mode] = run_sequential(args.fleet, tmp / "b", args.device, n, True, jobs[mode], jobs.get("a"))
        print(f"{mode}: {result[mode]:.1f} s {json.dumps({k: round(v, 1) for k, v in jobs[mode].items()})}",
              flush=True)
    report = {"devices": n, "device": args.device, "makespan_s": {k: round(v, 1) for k, v in result.items()},
              "job_s": {m: {k: round(v, 1) for k, v in d.items()} for m, d in jobs.items() if d},
              "a_measured": "in parallel, one job per GPU, summed" if args.a_parallel else "sequential"}
    if "fleet" in result and "a" in result:
        report["speedup_vs_a"] = round(result["a"] / result["fleet"], 2)
        report["target_vs_a"] = round(0.9 * n, 2)
    if "fleet" in result and "b" in result:
        report["speedup_vs_b"] = round(result["b"] / result["fleet"], 2)
    print(json.dumps(report), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
