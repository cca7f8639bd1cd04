"""Single-GPU baselines of the distributed jobs: the measured speedup behind `success.min_speedup`.

With `success.baseline_steps: N`, before the fleet starts, every task job with more than one GPU
trains N steps on ONE GPU (same per-rank batch; checkpoints off), several baselines side by side,
one per device. Its median samples/s goes to RUN/baselines/<job>.json and to the store
(`musubi.db`, keyed by the job's config, the machine and N), so the next run of the same job on
the same machine reuses it. The checklist divides the job's own throughput by it.
"""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.text import Text

from musubi.config.fleet import FleetSpec, TaskJob
from musubi.contract.run_files import RUN_FILES
from musubi.fleet.jobs import gpu_env
from musubi.records.evidence import machine_key, median_rate, train_records
from musubi.store.db import cache_key, db_path, lookup_baseline, store_baseline
from musubi.store.rundir import write_json
from musubi.topology.cores import usable_cores

log = logging.getLogger("musubi.fleet")

#: A baseline that runs longer than this is abandoned (the job's speedup is then not measured).
TIMEOUT_S = 1800


def baseline_key(job: TaskJob, steps: int, env: dict[str, Any]) -> str:
    """What decides a baseline: the job's config, the machine (host + GPU models), steps and torch."""
    return cache_key({"config": job.spec.resolved(), "steps": steps, "machine": list(machine_key(env)),
                      "torch": env.get("torch")})


def _spec_file(job: TaskJob, steps: int, folder: Path) -> Path:
    spec = job.spec.resolved()
    spec["train"]["max_steps"] = steps
    spec["train"]["log_every"] = max(1, steps // 10)  # enough log records for a median of the later half
    spec["checkpoint"]["enabled"] = False
    spec.setdefault("tracking", {})["mlflow"] = False
    path = folder / ".spec" / f"{job.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def rank_env(devices: list[int], device: int, kind: str, pin: bool) -> dict[str, str]:
    """The baseline rank's devices, threads and cores: what a fleet job's rank on `device` gets (LocalFleet: the
    cores shared by the fleet's devices, on the CPU pinned to the slot's own cores), not every core of the machine
    (on a busy CPU, two spinning intra-op threads made a step ~10x slower than the job's pinned ranks)."""
    threads = max(1, usable_cores() // max(1, len(devices)))
    cpus = None
    if pin and kind == "cpu":
        from musubi.fleet.machine import cpus_value
        from musubi.topology.cores import partition_cores, read_cpus

        cpus = cpus_value(partition_cores(list(devices), {}, read_cpus()), [device])
    return gpu_env([device], kind, threads, cpus)


def _measure(job: TaskJob, steps: int, folder: Path, device: int, kind: str,
             device_env: dict[str, str]) -> dict[str, Any]:
    out = folder / job.name
    argv = [sys.executable, "-m", "musubi.cli", "train", str(_spec_file(job, steps, folder)), "--out", str(out),
            "--nproc", "1", "--device", kind, "--no-check", "--fleet-member"]
    env = {**os.environ, **device_env, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    try:
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"no result after {TIMEOUT_S} s"}
    rate = median_rate(train_records(out / job.spec.name), warmup_fraction=0.5)  # the later half: steady state
    if res.returncode != 0 or rate is None:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit {res.returncode}"]
        return {"error": f"baseline failed: {tail[0][:300]}"}
    return {"samples_per_s": rate, "steps": steps, "device": device, "seconds": round(time.perf_counter() - t0, 1)}


def measure_baselines(spec: FleetSpec, run_dir: Path, devices: list[int], kind: str, env: dict[str, Any],
                      console: Console) -> dict[str, dict[str, Any]]:
    """RUN/baselines/<job>.json of every distributed task job (cached or measured now)."""
    steps = spec.success.baseline_steps
    jobs = [j for j in spec.jobs if isinstance(j, TaskJob) and j.gpus > 1]
    if not steps or not jobs:
        return {}
    folder = run_dir / RUN_FILES.baselines
    db = db_path(run_dir)
    results: dict[str, dict[str, Any]] = {}
    todo: list[tuple[TaskJob, str]] = []
    for job in jobs:
        if (folder / f"{job.name}.json").is_file():  # --resume: measured by the interrupted run
            continue
        key = baseline_key(job, steps, env)
        hit = lookup_baseline(db, key)
        if hit is not None:
            results[job.name] = {"samples_per_s": hit[0], **hit[1], "cached": True}
        else:
            todo.append((job, key))
    if todo:
        unit = "GPU" if kind == "cuda" else "CPU slot"
        console.print(Text(f"measuring single-{'GPU' if kind == 'cuda' else 'rank'} baselines ({steps} steps) of "
                           f"{len(todo)} distributed job(s) on {min(len(devices), len(todo))} {unit}(s)"))
        free: queue.Queue[int] = queue.Queue()
        for d in devices:
            free.put(d)

        def one(item: tuple[TaskJob, str]) -> tuple[str, str, dict[str, Any]]:
            job, key = item
            device = free.get()
            try:
                return job.name, key, _measure(job, steps, folder, device, kind,
                                               rank_env(devices, device, kind, spec.machine.pin_cpus))
            finally:
                free.put(device)

        with ThreadPoolExecutor(max_workers=max(1, len(devices))) as pool:
            for name, key, rec in pool.map(one, todo):
                results[name] = rec
                if "samples_per_s" in rec:
                    store_baseline(db, key, rec["samples_per_s"], {k: v for k, v in rec.items()
                                                                   if k != "samples_per_s"})
    for name, rec in results.items():
        write_json(folder / f"{name}.json", rec)
        if "error" in rec:
            log.warning("baseline of %s: %s (its speedup will not be measured)", name, rec["error"])
            console.print(Text(f"baseline of {name}: {rec['error']}"))
        else:
            console.print(Text(f"baseline of {name}: {rec['samples_per_s']:.1f} samples/s on one "
                               f"{'GPU' if kind == 'cuda' else 'CPU rank'}{' (cached)' if rec.get('cached') else ''}"))
    return results
