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
import subprocess
import sys
import tempfile
import time
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


def run_sequential(fleet: Path, out: Path, device: str, gpus_all: int, all_gpus: bool) -> float:
    """Each job alone, one after another: on one GPU (a), or on all GPUs for distributable jobs (b)."""
    spec = load_fleet(fleet)
    base = fleet.resolve().parent
    total = 0.0
    for job in spec.jobs:
        env = dict(os.environ)
        if isinstance(job, TaskJob):
            n = gpus_all if all_gpus else 1
            path = out / f"{job.name}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(job.spec.resolved()))
            argv = [sys.executable, "-m", "musubi.cli", "train", str(path), "--nproc", str(n), "--out",
                    str(out / job.name), "--device", device, "--no-check"]
            total += _run(argv, env, REPO)
        else:
            assert isinstance(job, CommandJob)
            job_dir = out / job.name
            job_dir.mkdir(parents=True, exist_ok=True)
            env.update(job.env, MUSUBI_JOB_DIR=str(job_dir), CUDA_VISIBLE_DEVICES="0" if device == "cuda" else "")
            total += _run(resolve_command(job, base), env, job_dir)
    return total


def main() -> None:
    """Run the selected modes and print the comparison."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleet", type=Path, default=REPO / "bench" / "fleet-bench.yaml")
    ap.add_argument("--modes", default="fleet,a,b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cpu-slots", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if args.device == "cuda":
        import torch

        n = torch.cuda.device_count()
    else:
        n = args.cpu_slots or 2
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    result: dict[str, float] = {}
    for mode in args.modes.split(","):
        if mode == "fleet":
            result[mode] = run_fleet(args.fleet, tmp / "fleet", args.device, args.cpu_slots)
        elif mode == "a":
            result[mode] = run_sequential(args.fleet, tmp / "a", args.device, n, all_gpus=False)
        elif mode == "b":
            result[mode] = run_sequential(args.fleet, tmp / "b", args.device, n, all_gpus=True)
        print(f"{mode}: {result[mode]:.1f} s", flush=True)
    report = {"devices": n, "device": args.device, "makespan_s": {k: round(v, 1) for k, v in result.items()}}
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
