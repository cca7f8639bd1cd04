"""The planner against measured runs: peak memory and step time of the `lm` task under DDP and FSDP.

    python bench/plan_check.py [--gpus 1,2,4] [--strategies ddp,fsdp] [--job bench/plan-lm.yaml]
                               [--calibrate-on ddp:4] [--device cuda|cpu] [--json OUT.json]

Each configuration is one `musubi train` (the run writes JOB/plan.json with the planner's
prediction for exactly that job). Memory: predicted allocated peak (weights, gradients,
optimizer, activations, buffers; no reserve) against the largest `mem_peak_allocated_gib` rank 0
logged. Step time: the planner is calibrated on ONE run (`--calibrate-on`, with the preflight's
all-reduce bandwidth: that run keeps its preflight) by `musubi plan --calibrate RUN`'s own code,
then predicts every other run. Targets: memory within 10 %, step time within 15 %.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from musubi.plan.calibrate import load_calibration  # noqa: E402
from musubi.plan.catalog import get_gpu  # noqa: E402
from musubi.plan.cluster import make_cluster  # noqa: E402
from musubi.plan.from_run import measured_step_time  # noqa: E402
from musubi.plan.layout import parse_layout  # noqa: E402
from musubi.plan.predict import predict  # noqa: E402
from musubi.plan.spec import spec_from_dict  # noqa: E402


def train(job: Path, out: Path, n: int, strategy: str, device: str, check: bool) -> Path:
    argv = [sys.executable, "-m", "musubi.cli", "train", str(job), "--nproc", str(n), "--out", str(out),
            "--device", device, "--set", f"train.strategy={strategy}"]
    if not check:
        argv.append("--no-check")
    t0 = time.perf_counter()
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv[3:])} failed ({res.returncode}):\n{res.stdout[-1500:]}\n{res.stderr[-2500:]}")
    print(f"  {strategy} x{n}: {time.perf_counter() - t0:.0f} s", flush=True)
    return next(out.rglob("plan.json")).parent


def peak_allocated(job_dir: Path) -> float | None:
    peaks = []
    for line in (job_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train" and "mem_peak_allocated_gib" in rec:
            peaks.append(rec["mem_peak_allocated_gib"])
    return max(peaks) if peaks else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", type=Path, default=REPO / "bench" / "plan-lm.yaml")
    ap.add_argument("--gpus", default="1,2,4")
    ap.add_argument("--strategies", default="ddp,fsdp")
    ap.add_argument("--calibrate-on", default="ddp:4")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    tmp = args.out or Path(tempfile.mkdtemp(prefix="plan-check-"))
    cal_strategy, cal_n = args.calibrate_on.split(":")
    runs: dict[tuple[str, int], Path] = {}
    for strategy in args.strategies.split(","):
        for n in map(int, args.gpus.split(",")):
            check = (strategy, n) == (cal_strategy, int(cal_n)) and args.device == "cuda"
            runs[(strategy, n)] = train(args.job, tmp / f"{strategy}-{n}", n, strategy, args.device, check)
    cal_dir = runs[(cal_strategy, int(cal_n))]
    eff, cal_report = load_calibration(cal_dir) if args.device == "cuda" else (None, None)
    rows = []
    for (strategy, n), job_dir in runs.items():
        plan = json.loads((job_dir / "plan.json").read_text())
        pred = plan.get("predicted") or {}
        mem_pred = (pred.get("memory_gib") or {}).get("allocated")
        mem_meas = peak_allocated(job_dir)
        row = {"strategy": strategy, "gpus": n, "layout": plan["layout"], "global_batch": plan["global_batch"],
               "memory_predicted_gib": mem_pred, "memory_measured_gib": mem_meas,
               "memory_error": (mem_pred / mem_meas - 1) if mem_pred and mem_meas else None,
               "memory_breakdown_gib": pred.get("memory_gib")}
        step_meas, _ = measured_step_time(job_dir, int(plan["global_batch"]))
        row["step_measured_s"] = step_meas
        row["step_uncalibrated_s"] = pred.get("step_time_s")
        if eff is not None and plan.get("gpu"):
            spec = spec_from_dict(dict(plan["model"]), "run")
            cluster = make_cluster(get_gpu(plan["gpu"]), n, 1)
            p = predict(spec, cluster, parse_layout(plan["layout"]), int(plan["global_batch"]), eff,
                        memory_precision=plan["memory_precision"])
            row["step_calibrated_s"] = p.step_time_s
            row["step_error"] = p.step_time_s / step_meas - 1
            row["calibration_run"] = (strategy, n) == (cal_strategy, int(cal_n))
        rows.append(row)
    report = {"job": str(args.job), "calibration": cal_report, "rows": rows,
              "device_name": json.loads((cal_dir / "plan.json").read_text()).get("device_name")}
    for r in rows:
        me = f"{r['memory_error']:+.1%}" if r["memory_error"] is not None else "-"
        se = f"{r['step_error']:+.1%}" if r.get("step_error") is not None else "-"
        print(f"{r['strategy']:>4} x{r['gpus']}: memory pred {r['memory_predicted_gib'] or 0:.2f} / meas "
              f"{r['memory_measured_gib'] or 0:.2f} GiB ({me}); step meas {r['step_measured_s'] * 1e3:.1f} ms, "
              f"calibrated pred {(r.get('step_calibrated_s') or 0) * 1e3:.1f} ms ({se})", flush=True)
    print(json.dumps(report, indent=1, default=str), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
