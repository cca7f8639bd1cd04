"""Synthetic telemetry of a synchronous job (no training): step records shaped like the recorder's."""

from __future__ import annotations

import json
import random
from pathlib import Path


def write_job(job_dir: Path, ranks: int = 2, steps: int = 80, slow_rank: int | None = None, factor: float = 1.0,
              data_ms: float = 1.0, comm_ms: float = 2.0, ckpt_every: int | None = None, ckpt_ms: float = 0.0,
              noise: float = 0.02, name: str = "job", seed: int = 0, gpu: bool = False, busy: float = 80.0,
              alloc_retries: int = 0, data_extra: dict[int, float] | None = None,
              cpu: dict[int, dict] | None = None) -> Path:
    """JOB/telemetry/rank{r}.jsonl (+ sampler files, job.json) of `steps` steps.

    `data_extra`: per rank, ms more batch wait a step; `cpu`: per rank, sampler figures that replace the
    defaults (proc_cpu, workers_cpu, cores, cores_cpu..., and the GPU figures: util, sm_active).
    """
    rng = random.Random(seed)
    tdir = job_dir / "telemetry"
    tdir.mkdir(parents=True, exist_ok=True)
    (job_dir / "job.json").write_text(json.dumps({"name": name, "config": {"name": name}}), encoding="utf-8")
    files = {r: open(tdir / f"rank{r}.jsonl", "w", encoding="utf-8") for r in range(ranks)}
    t = 1_800_000_000.0
    for k in range(1, steps + 1):
        work = {}
        for r in range(ranks):
            fwd = 10.0 * (1 + rng.uniform(-noise, noise))
            bwd = 20.0 * (1 + rng.uniform(-noise, noise))
            if r == slow_rank:
                bwd += (factor - 1) * 33.0
            work[r] = {"data": data_ms + (data_extra or {}).get(r, 0.0), "h2d": 0.1, "forward": fwd, "backward": bwd, "optimizer": 1.0}
        arrive = max(sum(w.values()) for w in work.values())
        ck = ckpt_ms if ckpt_every and k % ckpt_every == 1 and k > 1 else 0.0
        for r in range(ranks):
            secs = dict(work[r])
            secs["grad_comm"] = arrive - sum(work[r].values()) + comm_ms
            secs["log"] = 0.2
            if ck:
                secs["checkpoint"] = ck
            wall = sum(secs.values())
            rec = {"kind": "step", "step": k, "rank": r, "t": t, "wall_ms": wall, "host": secs, "micro": 1,
                   "spans": [[s, 0.0, v] for s, v in secs.items()]}
            if gpu:
                rec["gpu"], rec["gpu_wall_ms"] = secs, wall
            files[r].write(json.dumps(rec) + "\n")
            if gpu and k % 10 == 0:
                files[r].write(json.dumps({"kind": "memory", "step": k, "mem_alloc_retries": alloc_retries * k // steps})
                               + "\n")
        t += wall / 1e3
    for f in files.values():
        f.close()
    for r in range(ranks):
        with open(tdir / f"sampler-rank{r}.jsonl", "w", encoding="utf-8") as f:
            for i in range(int((t - 1_800_000_000.0) * 2) + 1):
                s = {"kind": "sample", "rank": r, "t": 1_800_000_000.0 + i / 2, "proc_cpu": 95.0,
                     "workers_cpu": 0.0, "workers": 0, "host_cpu": 90.0, "rss_gib": 1.0}
                if gpu:
                    s.update(util=min(100.0, busy + 15), sm_active=busy, mem_used_gib=20.0, mem_total_gib=80.0, power_w=600.0,
                             throttle=[])
                s.update((cpu or {}).get(r, {}))  # last: a test may set any figure of a rank, its GPU's too
                f.write(json.dumps(s) + "\n")
    return job_dir
