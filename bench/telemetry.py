"""Telemetry benchmark: overhead on vs off, the scenario suite, and a report from a real run.

GPU (the lent 4-GPU machine), two parts that each fit in a few minutes:

    python bench/telemetry.py --part overhead  --gpus 4 --json overhead.json
    python bench/telemetry.py --part scenarios --gpus 4 --runs 1 --keep-report docs/ --json scenarios.json

- overhead: `musubi train` of examples/resnet50-bench.yaml and examples/fcos-bench.yaml on
  --gpus GPUs with `telemetry.enabled=true` and `=false`, interleaved (--repeat);
  median step time from metrics.jsonl (log every 5 steps, after 15 warm-up
  steps); plus the recorder's own cost per step measured directly (section marks +
  CUDA events, `--micro`), which bounds the overhead without run-to-run noise.
- scenarios: healthy, data stall, slow rank x1.1 and x1.3, periodic checkpoint
  stall on resnet50 (fault sizes from the measured healthy step time); the
  label of each run; `--keep-report DIR` keeps report.html (+ trace) of the
  healthy and slow x1.3 runs for docs/.

CPU (here): `python bench/telemetry.py --cpu [--runs 10]` runs the same suite on 2
gloo ranks with the drill task, and the overhead pair with it.

Prints compact tables and writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from musubi.diagnose import drills  # noqa: E402

WARMUP = 15
MODELS = {"resnet50": "examples/resnet50-bench.yaml", "fcos": "examples/fcos-bench.yaml"}


def median_step_ms(job_dir: Path, first: int) -> float:
    """Median time per step between rank 0's log records after step `first` (metrics.jsonl)."""
    recs = [json.loads(ln) for ln in (job_dir / "metrics.jsonl").read_text().splitlines()]
    pts = sorted((r["step"], r["time"]) for r in recs if r.get("kind") == "train" and r["step"] >= first)
    per = [(t1 - t0) / (s1 - s0) * 1e3 for (s0, t0), (s1, t1) in zip(pts, pts[1:], strict=False) if s1 > s0]
    if not per:
        raise RuntimeError(f"{job_dir}: too few log records after step {first}")
    return statistics.median(per)


def overhead(job: Path, nproc: int, device: str, steps: int, repeat: int, work: Path) -> dict:
    """Median step time with telemetry on and off (interleaved runs), and the ratio."""
    times: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(repeat):
        for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
            out = work / f"ovh-{job.stem}-{mode}-{i}"
            shutil.rmtree(out, ignore_errors=True)
            jd, _ = drills.train_once(job, out, nproc, device, WARMUP + steps, "",
                                      (f"telemetry.enabled={'true' if mode == 'on' else 'false'}",
                                       "train.log_every=5", "checkpoint.enabled=false"))
            times[mode].append(median_step_ms(jd, WARMUP))
            print(f"  {job.stem} telemetry {mode}: {times[mode][-1]:.2f} ms/step", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    return {"job": job.stem, "world": nproc, "device": device, "step_ms_on": round(on, 3),
            "step_ms_off": round(off, 3), "overhead_pct": round(100 * (on / off - 1), 2), "runs": times}


def micro(device: str, steps: int = 2000) -> dict:
    """The recorder's own cost per step: 8 section marks (a CUDA event each on GPU) and one step record."""
    import torch

    from musubi.telemetry.spans import SpanRecorder

    dev = torch.device(device)
    d = Path(tempfile.mkdtemp(prefix="musubi-micro-"))
    rec = SpanRecorder(d / "rank0.jsonl", 0, dev)
    names = ("data", "h2d", "forward", "backward", "optimizer")
    t0 = time.perf_counter()
    for k in range(1, steps + 1):
        for n in names:
            rec.section(n)
        rec.presync()
        rec.step_done(k)
    cost_us = (time.perf_counter() - t0) / steps * 1e6
    rec.close()
    shutil.rmtree(d, ignore_errors=True)
    return {"device": device, "recorder_us_per_step": round(cost_us, 1)}


def rejudge(folder: Path) -> list[dict]:
    """Judge every kept scenario run (`NAME-RUN/`) of `folder` with the current code."""
    rows = []
    for run in sorted(folder.iterdir(), key=lambda p: (int(p.name.rsplit("-", 1)[1]), p.name)):
        name, _, i = run.name.rpartition("-")
        jobs = [p for p in run.iterdir() if (p / "job.json").is_file()]
        if name not in drills.SCENARIOS or not jobs or not (jobs[0] / "summary.json").is_file():
            continue  # unfinished run
        row = drills.judge(drills.SCENARIOS[name], jobs[0])
        row["run"] = int(i)
        rows.append(row)
    return rows


def write_job(spec: dict, work: Path) -> Path:
    import yaml

    p = work / f"{spec['name']}.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def main() -> None:
    """Run the chosen parts and print their tables."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="CPU mode: 2 gloo ranks, the drill task")
    ap.add_argument("--part", default="all", choices=["overhead", "scenarios", "all"])
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=2, help="CPU mode: gloo ranks (the issue asks 2-4)")
    ap.add_argument("--models", default="resnet50,fcos")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per overhead run (after 15 warm-up)")
    ap.add_argument("--repeat", type=int, default=1, help="overhead runs per setting (interleaved)")
    ap.add_argument("--runs", type=int, default=1, help="runs per scenario (the issue asks 10)")
    ap.add_argument("--scenario-steps", type=int, default=None, help="steps per scenario run (80 CPU, 60 GPU)")
    ap.add_argument("--scenario-batch", type=int, default=None, help="per-GPU batch of the scenario runs")
    ap.add_argument("--scenarios", default=",".join(drills.SCENARIOS))
    ap.add_argument("--keep-report", type=Path, default=None, help="copy report.html of real runs here")
    ap.add_argument("--keep-runs", type=Path, default=None, help="keep every scenario run directory here")
    ap.add_argument("--rejudge", type=Path, default=None,
                    help="diagnose the kept runs of an earlier --keep-runs DIR again (no training)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.rejudge:
        rows = rejudge(args.rejudge)
        print(drills.markdown(drills.summarize(rows)))
        if args.json:
            args.json.write_text(json.dumps({"scenarios": rows, "scenario_summary": drills.summarize(rows)}, indent=1))
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # keep NVLink multicast off (shared hosts)
    work = Path(tempfile.mkdtemp(prefix="musubi-telemetry-bench-"))
    device = "cpu" if args.cpu else "cuda"
    nproc = args.nproc if args.cpu else args.gpus
    result: dict = {"device": device, "world": nproc}
    if args.cpu:
        cpu_job = write_job(drills.CPU_DRILL_JOB, work)
        jobs = {"drill": cpu_job}
    else:
        jobs = {m: REPO / MODELS[m] for m in args.models.split(",")}
    if args.part in ("overhead", "all"):
        result["micro"] = micro(device)
        print(f"recorder cost: {result['micro']['recorder_us_per_step']} us per step ({device})", flush=True)
        result["overhead"] = [overhead(j, nproc, device, args.steps, args.repeat, work) for j in jobs.values()]
        print("\n| job | ranks | step ms, telemetry off | on | overhead | recorder cost per step |")
        print("|---|---|---|---|---|---|")
        for r in result["overhead"]:
            cost = result["micro"]["recorder_us_per_step"] / 1e3
            print(f"| {r['job']} | {r['world']} | {r['step_ms_off']:.2f} | {r['step_ms_on']:.2f} | "
                  f"{r['overhead_pct']:+.2f} % | {cost:.3f} ms = {100 * cost / r['step_ms_off']:.2f} % |")
    if args.part in ("scenarios", "all"):
        job = jobs["drill"] if args.cpu else jobs[args.models.split(",")[0]]
        sets: tuple[str, ...] = () if args.cpu else ("checkpoint.enabled=false",)
        if args.scenario_batch:
            sets = (*sets, f"train.batch={args.scenario_batch}")
        steps = args.scenario_steps or (80 if args.cpu else 60)
        if args.cpu:
            step_ms = drills.CPU_STEP_MS
        else:  # fault sizes follow this model's healthy step on this machine
            out = work / "calibrate"
            jd, _ = drills.train_once(job, out, nproc, device, 40, "", (*sets, "train.log_every=5"))
            step_ms = median_step_ms(jd, 15)
            shutil.rmtree(out, ignore_errors=True)
        print(f"scenarios on {job.stem}: healthy step {step_ms:.1f} ms", flush=True)
        keep = args.keep_report is not None or args.keep_runs is not None
        suite = args.keep_runs or work / "suite"
        rows = drills.run_suite(job, args.scenarios.split(","), args.runs, nproc, device, steps,
                                step_ms, suite, keep=keep, extra_sets=sets)
        if args.keep_report is not None:
            from musubi.diagnose.report import build_report

            args.keep_report.mkdir(parents=True, exist_ok=True)
            for name in ("healthy", "slow_1.3"):
                run = suite / f"{name}-0"
                if run.is_dir():
                    rep = build_report(run, args.keep_report / f"telemetry-report-{device}-{name}.html")
                    print(f"kept {rep['html']}", flush=True)
        result["scenarios"] = rows
        result["scenario_summary"] = drills.summarize(rows)
        print()
        print(drills.markdown(result["scenario_summary"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
