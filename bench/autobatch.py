"""`batch: auto` on real GPUs: probe time, probed batch vs an exhaustive search, and OOM recovery.

    python bench/autobatch.py [--models resnet50,fcos,lm] [--nproc 4] [--exhaustive] [--recover]

- probe: `musubi train JOB --probe-only --set train.batch=auto` on `--nproc` GPUs (every rank
  probes its own GPU, the ranks agree on the minimum); figures from JOB/memory/probe.json.
- exhaustive (`--exhaustive`, one GPU): the same trial runner and the same fit criterion
  (headroom), but growth then bisection down to a single sample: the true largest batch.
- recover (`--recover`): resnet50 started at a per-GPU batch far too large; seconds from the
  OOM record to the first logged step after the coordinated restart.
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

REPO = Path(__file__).resolve().parents[1]
JOBS = {
    "resnet50": ("examples/resnet50-bench.yaml", []),
    "fcos": ("examples/fcos-bench.yaml", []),
    "lm": ("examples/lm-fsdp.yaml", ["train.strategy=ddp", "model_args.layers=12", "model_args.hidden=1024",
                                     "model_args.heads=16", "data.synthetic.seq_len=1024",
                                     "data.synthetic.train_size=1000000", "train.precision=bf16"]),
}


def _sets(extra: list[str]) -> list[str]:
    out: list[str] = []
    for s in extra:
        out += ["--set", s]
    return out


def probe(model: str, nproc: int) -> dict:
    """The probe through the CLI; its own timing from probe.json."""
    job, extra = JOBS[model]
    out = Path(tempfile.mkdtemp(prefix=f"probe-{model}-")) / "run"
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "musubi.cli", "train", str(REPO / job), "--nproc", str(nproc),
                          "--out", str(out), "--probe-only", "--no-check", *_sets(["train.batch=auto", *extra])],
                         capture_output=True, text=True, cwd=REPO, timeout=900)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"probe {model} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    name = Path(job).stem if model != "lm" else "lm-fsdp"
    detail = json.loads((out / name / "memory" / "probe.json").read_text())
    # The true largest batch lies below the smallest size that failed on this rank: a lower
    # bound of probed/true without an exhaustive search.
    fails = [t["batch"] for t in detail["trials"] if not t["fits"] and t["batch"] > detail["local_batch"]]
    bound = round(detail["local_batch"] / (min(fails) - 1), 3) if fails else None
    return {"ratio_lower_bound": bound, "model": model, "gpus": nproc, "batch": detail["batch"], "local_batch": detail["local_batch"],
            "peak_gib": detail["peak_gib"], "total_gib": detail["total_gib"], "probe_s": detail["seconds"],
            "trials": len(detail["trials"]), "wall_s": round(wall, 1)}


def exhaustive_child(model: str) -> None:
    """(Under torchrun, 1 process.) Growth then bisection to one sample, same trials and criterion."""
    from musubi.config.load import load_job
    from musubi.contract.inject import Injector
    from musubi.contract.world import init_world, shutdown_world
    from musubi.tasks.registry import build_task
    from musubi.worker.autobatch import _Trial
    from musubi.worker.precision import resolve_precision
    from musubi.worker.trainer import build_optimizer

    job, extra = JOBS[model]
    spec = load_job(REPO / job, ["train.batch=auto", *extra])
    world = init_world(600)
    task = build_task(spec)
    precision = resolve_precision(spec.train.precision, world.device)
    trial = _Trial(task, world, precision, lambda m: build_optimizer(m, spec, 1e-3), spec.train.channels_last,
                   Injector(None, 0, None))
    t0 = time.perf_counter()
    good, bad, b, n = 0, None, 1, 0
    while bad is None and b <= 8192:
        n += 1
        if trial.run(b, spec.train.headroom)[0]:
            good, b = b, b * 2
        else:
            bad = b
    lo, hi = good, bad or good + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        n += 1
        if trial.run(mid, spec.train.headroom)[0]:
            lo = mid
        else:
            hi = mid
    print(json.dumps({"model": model, "true_largest": lo, "trials": n, "seconds": round(time.perf_counter() - t0, 1)}),
          flush=True)
    trial.close()
    shutdown_world()


def exhaustive(model: str) -> dict:
    """Run the exhaustive child on one GPU."""
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                          str(Path(__file__).resolve()), "--exhaustive-child", model],
                         capture_output=True, text=True, cwd=REPO, timeout=900,
                         env=dict(os.environ, PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}"))
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"exhaustive {model} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return json.loads(lines[-1])


def recover(nproc: int, batch: int) -> dict:
    """resnet50 at a per-GPU batch far too large: time from the OOM to training again."""
    out = Path(tempfile.mkdtemp(prefix="recover-")) / "run"
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "musubi.cli", "train", str(REPO / "examples/resnet50-bench.yaml"),
                          "--nproc", str(nproc), "--out", str(out), "--max-steps", "20", "--no-check",
                          *_sets([f"train.batch={batch}", "train.log_every=1", "train.min_batch=8"])],
                         capture_output=True, text=True, cwd=REPO, timeout=900)
    wall = time.perf_counter() - t0
    jd = out / "resnet50-bench"
    if res.returncode != 0:
        raise RuntimeError(f"recovery run failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    ooms = [json.loads(p.read_text()) for p in sorted((jd / "memory").glob("applied-oom-*.json"))]
    steps = [json.loads(ln) for ln in (jd / "metrics.jsonl").read_text().splitlines()]
    t_oom = min(o["time"] for o in ooms)
    t_next = min(r["time"] for r in steps if r["time"] > t_oom)
    plan = json.loads((jd / "memory" / "batch.json").read_text())
    return {"start_batch": batch, "final_per_rank": plan["per_rank"], "accumulation": plan["accumulation"],
            "ooms": len(ooms), "oom_to_training_s": round(t_next - t_oom, 1), "wall_s": round(wall, 1),
            "history": plan["history"]}


def main() -> None:
    """Run the selected parts; print JSON lines and a table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,fcos,lm")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--exhaustive", action="store_true")
    ap.add_argument("--recover", action="store_true")
    ap.add_argument("--recover-batch", type=int, default=4096)
    ap.add_argument("--exhaustive-child", default=None)
    args = ap.parse_args()
    if args.exhaustive_child:
        exhaustive_child(args.exhaustive_child)
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rows = []
    for model in args.models.split(","):
        p = probe(model, args.nproc)
        if args.exhaustive:
            e = exhaustive(model)
            p.update(true_largest=e["true_largest"], exhaustive_s=e["seconds"],
                     ratio=round(p["local_batch"] / e["true_largest"], 3))
        print(json.dumps(p), flush=True)
        rows.append(p)
    if args.recover:
        r = recover(args.nproc, args.recover_batch)
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
