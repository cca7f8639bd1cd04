"""OOM-recovery drill on CPU ranks: N runs per phase with an OOM injected on one rank.

    python bench/oom_stress.py [--runs 20] [--ranks 2] [--phases forward,backward,optimizer]

Every run must finish (no hang: each has a timeout), redo the failed step (train
steps logged exactly once), and end with weights within float tolerance of an
unfaulted run (keep_global_batch). Prints a summary table for BENCHMARKS.md.
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

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.runs import final_state  # noqa: E402

JOB = {
    "name": "tiny", "task": "tests.support.tiny_task:make", "model": "mlp",
    "data": {"synthetic": {"train_size": 128, "val_size": 30}, "workers": 0},
    "train": {"epochs": 2, "batch": 8, "lr": 0.1, "base_batch": 16, "log_every": 4, "seed": 3, "min_batch": 2},
    "checkpoint": {"every_steps": 2},
}


def run(out: Path, ranks: int, inject: str | None, timeout: float) -> tuple[int, float]:
    """One `musubi train` on CPU ranks; (exit code, seconds); -9 on timeout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    job = out.parent / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    env = dict(os.environ, MUSUBI_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
    env.pop("MUSUBI_INJECT", None)
    if inject:
        env["MUSUBI_INJECT"] = inject
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "musubi.cli", "train", str(job), "--nproc", str(ranks), "--out",
                            str(out), "--device", "cpu"], cwd=REPO, env=env, capture_output=True, timeout=timeout)
        return p.returncode, time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        return -9, time.perf_counter() - t0


def main() -> None:
    """Run the drill and print the table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--phases", default="forward,backward,optimizer")
    ap.add_argument("--timeout", type=float, default=180)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="oom-drill-"))
    code, _ = run(tmp / "clean" / "run", args.ranks, None, args.timeout)
    assert code == 0, "the unfaulted run failed"
    clean = final_state(tmp / "clean" / "run" / "tiny")
    rows = []
    for phase in args.phases.split(","):
        ok = hung = steps_ok = close = 0
        secs = []
        for i in range(args.runs):
            out = tmp / f"{phase}-{i}" / "run"
            code, s = run(out, args.ranks, f"oom:rank={args.ranks - 1},step=5,phase={phase}", args.timeout)
            secs.append(s)
            hung += code == -9
            if code != 0:
                continue
            ok += 1
            jd = out / "tiny"
            steps = [json.loads(ln)["step"] for ln in (jd / "metrics.jsonl").read_text().splitlines()
                     if json.loads(ln)["kind"] == "train"]
            steps_ok += steps == [4, 8, 12, 16]
            got = final_state(jd)
            close += all(torch.allclose(got[k], clean[k], rtol=1e-4, atol=1e-5) for k in clean if k.startswith("model."))
        rows.append((phase, args.runs, ok, hung, steps_ok, close, sum(secs) / len(secs)))
        print(f"{phase}: {ok}/{args.runs} finished, {hung} hung, {steps_ok} steps exact, {close} weights close",
              flush=True)
    print(f"\n| phase (rank {args.ranks - 1} of {args.ranks}) | runs | finished | hung | each step once | "
          "weights == unfaulted (tol) | mean s/run |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]:.1f} |")


if __name__ == "__main__":
    main()
