"""Weak-scaling benchmark: `musubi train` against plain DDP and Lightning, same call, same card.

Runs, for each GPU count (1, 2, 4 by default), the reference
`plain_ddp.py` (resnet50 bs256 bf16 and fcos bs16 bf16, data on the GPU) and
the equivalent Musubi jobs (`examples/resnet50-bench.yaml`,
`examples/fcos-bench.yaml`, data made on the GPU too), then Lightning's
resnet50 on all GPUs. Musubi's throughput is read from its own
`metrics.jsonl` (rank 0 logs after a host sync every `--log-every` steps), over
the same steps the reference times (after its 15 warm-up steps).

    python bench/scaling.py --ref DIR_WITH_REFERENCE_PROGRAMS [--gpus 1,2,4] [--steps 80] [--json OUT.json]

Prints a markdown table (for BENCHMARKS.md) and writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARMUP = 15  # the reference's warm-up steps
MODELS = {"resnet50": (256, "examples/resnet50-bench.yaml"), "fcos": (16, "examples/fcos-bench.yaml")}


def _last_json_line(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            return json.loads(line)
    raise RuntimeError(f"no JSON line in output:\n{text[-3000:]}")


def run_plain(ref: Path, model: str, n: int, batch: int, steps: int) -> dict:
    """The hand-written DDP reference under torchrun."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           str(ref / "plain_ddp.py"), model, str(batch), str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900)
    return _last_json_line(out.stdout)


def run_musubi(model: str, n: int, steps: int, log_every: int) -> dict:
    """`musubi train` on the benchmark job; samples/s over steps WARMUP..WARMUP+steps."""
    batch, job = MODELS[model]
    out_dir = Path(tempfile.mkdtemp(prefix=f"musubi-{model}-{n}-"))
    stop = WARMUP + steps
    cmd = [sys.executable, "-m", "musubi.cli", "train", str(REPO / job), "--nproc", str(n), "--out",
           str(out_dir / "run"), "--max-steps", str(stop), "--no-check", "--set", f"train.log_every={log_every}"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"musubi failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    name = Path(job).stem
    recs = [json.loads(ln) for ln in (out_dir / "run" / name / "metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in recs if r["kind"] == "train"}
    summary = json.loads((out_dir / "run" / name / "summary.json").read_text())
    shutil.rmtree(out_dir, ignore_errors=True)
    if WARMUP not in times or stop not in times:
        raise RuntimeError(f"log steps {WARMUP} and {stop} missing (log_every must divide both): {sorted(times)}")
    dt = times[stop] - times[WARMUP]
    return {"model": model, "world": n, "per_gpu_batch": batch,
            "samples_per_s": round(batch * n * steps / dt, 1), "median_step_ms": round(dt / steps * 1e3, 2),
            "global_batch": summary["global_batch"], "wall_s": round(wall, 1)}


def run_lightning(ref: Path, steps: int) -> dict:
    """Lightning's Trainer on all GPUs (resnet50 bs256 bf16-mixed)."""
    out = subprocess.run([sys.executable, str(ref / "lightning_resnet50.py"), "256", str(steps)],
                         capture_output=True, text=True, check=True, timeout=900)
    return _last_json_line(out.stdout)


def main() -> None:
    """Run the whole comparison and print the table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", type=Path, required=True, help="folder holding plain_ddp.py and lightning_resnet50.py")
    ap.add_argument("--gpus", default="1,2,4")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--models", default="resnet50,fcos")
    ap.add_argument("--no-lightning", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each program (interleaved); the median is kept")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # keep NVLink multicast off (shared hosts)
    gpus = [int(g) for g in args.gpus.split(",")]
    rows: list[dict] = []
    for model in args.models.split(","):
        batch = MODELS[model][0]
        for n in gpus:
            runs: dict[str, list[dict]] = {"plain_ddp": [], "musubi": []}
            for rep in range(args.repeat):
                # Alternate the order so a drift of the machine does not favour one program.
                order = ["plain_ddp", "musubi"] if rep % 2 == 0 else ["musubi", "plain_ddp"]
                for prog in order:
                    r = (run_plain(args.ref, model, n, batch, args.steps) if prog == "plain_ddp"
                         else run_musubi(model, n, args.steps, args.log_every))
                    runs[prog].append(r)
            for prog, rs in runs.items():
                rates = sorted(r["samples_per_s"] for r in rs)
                med = dict(sorted(rs, key=lambda r: r["samples_per_s"])[len(rs) // 2])
                med.update(program=prog, runs=rates)
                rows.append(med)
            plain, mus = rows[-2], rows[-1]
            print(f"{model} x{n}: plain {plain['runs']} musubi {mus['runs']} samples/s "
                  f"(median ratio {mus['samples_per_s'] / plain['samples_per_s']:.3f})", flush=True)
    if not args.no_lightning and "resnet50" in args.models:
        light = run_lightning(args.ref, args.steps)
        light["program"] = "lightning"
        rows.append(light)
        print(f"lightning resnet50 x{light['world']}: {light['samples_per_s']} samples/s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print_table(rows)


def print_table(rows: list[dict]) -> None:
    """Markdown: samples/s, musubi/plain ratio, weak-scaling efficiency from 1 GPU."""
    base = {(r["program"], r["model"]): r["samples_per_s"] for r in rows if r["world"] == 1}
    plain = {(r["model"], r["world"]): r["samples_per_s"] for r in rows if r["program"] == "plain_ddp"}
    print("\n| program | model | GPUs | samples/s | vs plain DDP | weak-scaling eff. |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        model = r["model"].replace("resnet50-lightning", "resnet50")
        ratio = r["samples_per_s"] / plain[(model, r["world"])] if (model, r["world"]) in plain else float("nan")
        b = base.get((r["program"], model))
        eff = f"{100 * r['samples_per_s'] / (r['world'] * b):.1f} %" if b else "-"
        print(f"| {r['program']} | {model} | {r['world']} | {r['samples_per_s']} | {ratio:.3f} | {eff} |")


if __name__ == "__main__":
    main()
