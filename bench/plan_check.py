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
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from musubi.plan.calibrate import calibrate, load_calibrations  # noqa: E402
from musubi.plan.catalog import get_gpu  # noqa: E402
from musubi.plan.cluster import make_cluster  # noqa: E402
from musubi.plan.efficiency import DEFAULT_EFFICIENCY  # noqa: E402
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


def predicted_step(row: dict, model: dict, gpu: str, eff) -> float:
    spec = spec_from_dict(dict(model), "run")
    cluster = make_cluster(get_gpu(gpu), row["gpus"], 1)
    return predict(spec, cluster, parse_layout(row["layout"]), int(row["global_batch"]), eff,
                   memory_precision="amp").step_time_s


def add_predictions(rows: list[dict], model: dict, gpu: str, eff, cal: list[tuple[str, int]]) -> None:
    for row in rows:
        row["step_calibrated_s"] = predicted_step(row, model, gpu, eff)
        row["step_error"] = row["step_calibrated_s"] / row["step_measured_s"] - 1
        row["calibration_run"] = (row["strategy"], row["gpus"]) in cal


def measure(args, cal: list[tuple[str, int]]) -> dict:
    """Run every configuration, read memory and step time, calibrate on `cal`, predict all."""
    tmp = args.out or Path(tempfile.mkdtemp(prefix="plan-check-"))
    runs: dict[tuple[str, int], Path] = {}
    for strategy in args.strategies.split(","):
        for n in map(int, args.gpus.split(",")):
            check = (strategy, n) == cal[0] and args.device == "cuda"
            runs[(strategy, n)] = train(args.job, tmp / f"{strategy}-{n}", n, strategy, args.device, check)
    rows = []
    for (strategy, n), job_dir in runs.items():
        plan = json.loads((job_dir / "plan.json").read_text())
        pred = plan.get("predicted") or {}
        mem_pred = (pred.get("memory_gib") or {}).get("allocated")
        mem_meas = peak_allocated(job_dir)
        step_meas, _ = measured_step_time(job_dir, int(plan["global_batch"]))
        rows.append({"strategy": strategy, "gpus": n, "layout": plan["layout"], "global_batch": plan["global_batch"],
                     "memory_predicted_gib": mem_pred, "memory_measured_gib": mem_meas,
                     "memory_error": (mem_pred / mem_meas - 1) if mem_pred and mem_meas else None,
                     "memory_breakdown_gib": pred.get("memory_gib"), "step_measured_s": step_meas,
                     "step_uncalibrated_s": pred.get("step_time_s")})
    first = json.loads((runs[cal[0]] / "plan.json").read_text())
    report = {"job": str(args.job), "device_name": first.get("device_name"), "gpu": first.get("gpu"),
              "model": first["model"], "calibrated_on": cal, "rows": rows, "calibration": None}
    if args.device == "cuda" and first.get("gpu"):
        eff, report["calibration"] = load_calibrations([runs[c] for c in cal])
        add_predictions(rows, first["model"], first["gpu"], eff, cal)
    return report


def reanalyse(old: dict, cal: list[tuple[str, int]], job: Path) -> dict:
    """Predictions from an earlier report's measurements: the planner is pure math, so the same
    inputs (measured step times, the preflight's bandwidth as a fraction of the link) give the
    same calibration it would have fitted on the GPU machine."""
    from musubi.config.load import load_job
    from musubi.tasks.registry import build_task

    model = old.get("model") or asdict(build_task(load_job(job)).plan_spec())
    gpu = old.get("gpu") or (old.get("calibration") or {}).get("gpu")
    rows = old["rows"]
    by_key = {(r["strategy"], r["gpus"]): r for r in rows}
    gpu_entry = get_gpu(gpu)
    eff = DEFAULT_EFFICIENCY
    report_cal = None
    for i, key in enumerate(cal):
        r = by_key[key]
        data = {"gpu": gpu, "step_time_s": r["step_measured_s"], "model": model, "layout": r["layout"],
                "gpus": r["gpus"], "nodes": 1, "global_batch": r["global_batch"]}
        nvlink = (old.get("calibration") or {}).get("nvlink")
        if i == 0 and nvlink:
            data["allreduce_busbw_gbps"] = {"nvlink": nvlink * gpu_entry.nvlink_gbps}
        eff, rep = calibrate(data, eff)
        report_cal = {**(report_cal or {}), **rep}
    rows = [dict(r) for r in rows]
    add_predictions(rows, model, gpu, eff, cal)
    return {**old, "model": model, "gpu": gpu, "calibrated_on": cal, "calibration": report_cal, "rows": rows,
            "reanalysed_from": "earlier report"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", type=Path, default=REPO / "bench" / "plan-lm.yaml")
    ap.add_argument("--gpus", default="1,2,4")
    ap.add_argument("--strategies", default="ddp,fsdp")
    ap.add_argument("--calibrate-on", default="ddp:4,fsdp:4",
                    help="runs the planner is calibrated on, STRATEGY:GPUS, comma-separated (the first keeps its "
                         "preflight for the all-reduce bandwidth)")
    ap.add_argument("--reanalyse", type=Path, default=None,
                    help="recompute the predictions from an earlier --json report (measured figures reused)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    cal = [(c.split(":")[0], int(c.split(":")[1])) for c in args.calibrate_on.split(",")]
    if args.reanalyse is not None:
        report = reanalyse(json.loads(args.reanalyse.read_text()), cal, args.job)
    else:
        report = measure(args, cal)
    rows = report["rows"]
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
