"""The scenario suite: train with a fault injected through MUSUBI_INJECT, diagnose, check the label.

Scenarios: healthy, data stall, one slow rank (factor 1.1 and 1.3), periodic
checkpoint stall. Fault sizes are fractions of the healthy step time
(`step_ms`), so the same suite runs on CPU ranks (the drill task) and on GPUs
(resnet50, fcos). Used by tests/diagnose/test_scenarios.py (few runs) and
bench/telemetry.py (10 runs per scenario, as the issue asks).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musubi.contract.env import MUSUBI_INJECT
from musubi.contract.run_files import RUN_FILES
from musubi.diagnose.classify import analyze
from musubi.diagnose.timeline import load_job

SLOW_RANK = 1
FLAG_WITHIN = 50  # steps: a 10 % slow rank must be flagged live by then


@dataclass(frozen=True)
class Scenario:
    """One drill: the fault (from the healthy step time in ms), the expected label, job overrides."""

    name: str
    inject: Callable[[float], str]
    expect: str
    rank: int | None = None
    sets: tuple[str, ...] = field(default_factory=tuple)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", lambda ms: "", "healthy compute bound"),
    # 1.5 steps: on a GPU the host runs ahead of the device, so a shorter stall can hide in that slack.
    Scenario("data_stall", lambda ms: f"data_stall:ms={max(1, round(1.5 * ms))}", "input bound"),
    Scenario("slow_1.1", lambda ms: f"slow:rank={SLOW_RANK},factor=1.1", "straggler", rank=SLOW_RANK),
    Scenario("slow_1.3", lambda ms: f"slow:rank={SLOW_RANK},factor=1.3", "straggler", rank=SLOW_RANK),
    Scenario("ckpt_stall", lambda ms: f"ckpt_stall:ms={max(50, round(4 * ms))}", "periodic checkpoint stall",
             sets=("checkpoint.enabled=true", "checkpoint.every_steps=10")),
)}

#: The CPU drill job: a small MLP with 30 ms of simulated device time per step (see drill_task.py).
CPU_DRILL_JOB: dict[str, Any] = {
    "name": "drill",
    "task": "musubi.diagnose.drill_task:make",
    "model": "mlp",
    "model_args": {"hidden": 128, "layers": 2, "device_ms": 30},
    "data": {"synthetic": {"train_size": 100_000, "val_size": 0}, "workers": 0},
    "train": {"epochs": 1, "batch": 16, "lr": 0.05, "base_batch": 32, "log_every": 10},
    "checkpoint": {"enabled": False},
    # Sleep jitter on a shared 2-core CPU reaches a few ms a step for tens of steps: a higher bar than
    # the 5 % default (GPU), still well under the 10 % slow rank the suite must catch.
    "telemetry": {"straggler_threshold": 0.07},
}
CPU_STEP_MS = 33.0  # its healthy step time (2 gloo ranks), what the fault sizes are computed from


#: How a suite trains one drill: (job, out, nproc, device, steps, inject, sets) -> (job folder, wall s).
TrainOnce = Callable[[Path, Path, int, str, int, str, tuple[str, ...]], tuple[Path, float]]


def train_args(job: Path, out: Path, nproc: int, device: str, steps: int, sets: tuple[str, ...] = ()) -> list[str]:
    """The arguments of one drill's `musubi train` (after `musubi`): no preflight, `steps` steps, `sets` applied."""
    args = ["train", str(job), "--nproc", str(nproc), "--device", device, "--out", str(out), "--no-check",
            "--set", f"train.max_steps={steps}"]
    for s in sets:
        args += ["--set", s]
    return args


def job_folder(out: Path) -> Path:
    """The job folder a drill's `musubi train --out OUT` wrote (the one holding job.json)."""
    return next(p for p in out.iterdir() if (p / RUN_FILES.job).is_file())


def train_once(job: Path, out: Path, nproc: int, device: str, steps: int, inject: str = "",
               sets: tuple[str, ...] = (), timeout_s: float = 900,
               env_extra: dict[str, str] | None = None) -> tuple[Path, float]:
    """`musubi train` in a subprocess with MUSUBI_INJECT (and `env_extra`); the job folder and the wall time (s)."""
    env = dict(os.environ)
    env[MUSUBI_INJECT] = inject
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "musubi.cli", *train_args(job, out, nproc, device, steps, sets)]
    t0 = time.perf_counter()
    # Its own session, so a run past its time is stopped whole: SIGTERM to the group reaches torchrun,
    # which stops its ranks (killing only the CLI would leave torchrun restarting them, orphaned).
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.communicate(timeout=grace)
                break
        raise
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"musubi train failed ({p.returncode}): {stdout[-1500:]}\n{stderr[-2500:]}")
    return job_folder(out), wall


def judge(scenario: Scenario, job_dir: Path) -> dict[str, Any]:
    """Diagnose one drill's job and say whether the label (and straggler rank, flag step) is right."""
    tele = load_job(job_dir)
    a = analyze(tele)
    live = [f for f in tele.flags if f.get("kind") == "straggler"]
    flagged = [s["rank"] for s in a["stragglers"]["stragglers"]]
    row: dict[str, Any] = {"scenario": scenario.name, "label": a["label"], "text": a.get("text"),
                           "evidence": a.get("evidence"), "step_ms": a.get("step_ms_median"),
                           "coverage_min": min((b["coverage_min"] for b in a.get("breakdown", {}).values()
                                                if b.get("coverage_min") is not None), default=None),
                           "stragglers": flagged, "live_flags": [(f["rank"], f["step"]) for f in live]}
    ok = a["label"] == scenario.expect
    if scenario.name == "data_stall":  # the stall is a wait for the batch: `data`, not the host-to-device copy
        bd = a.get("breakdown", {}).values()
        row["data_in_data"] = bool(bd) and all(b["sections_ms"].get("data", 0.0) > b["sections_ms"].get("h2d", 0.0)
                                               for b in bd)
        ok = ok and row["data_in_data"]
    # When the streaming detector (what rank 0's watch runs, replayed here on the recorded steps, so a
    # suite can be re-judged after a change of rule) first flagged each rank.
    replay = {s["rank"]: s["flagged_at"] for s in a["stragglers"]["ranks"] if s.get("flagged_at")}
    row["replayed_flags"] = sorted(replay.items())
    # What rank 0's watch flagged during the run (stragglers.jsonl): a watch that stopped must fail the drill.
    live_first: dict[int, int] = {}
    for f in live:
        live_first[int(f["rank"])] = min(int(f["step"]), live_first.get(int(f["rank"]), int(f["step"])))
    if scenario.rank is not None:
        first = replay.get(scenario.rank)
        row["flagged_at"] = first
        row["live_flagged_at"] = live_first.get(scenario.rank)
        ok = ok and flagged == [scenario.rank]
        row["flagged_in_time"] = (first is not None and first <= FLAG_WITHIN and row["live_flagged_at"] is not None
                                  and row["live_flagged_at"] <= FLAG_WITHIN)
    else:
        row["false_straggler"] = bool(flagged or replay or live_first)
        if scenario.name == "healthy":
            ok = ok and not row["false_straggler"]
    row["ok"] = ok
    return row


def run_suite(job: Path, names: list[str], runs: int, nproc: int, device: str, steps: int, step_ms: float,
              workdir: Path, log: Callable[[str], None] = print, keep: bool = False,
              extra_sets: tuple[str, ...] = (), train: TrainOnce = train_once) -> list[dict[str, Any]]:
    """Every scenario `runs` times (interleaved, so a drift of the machine hits all alike), each trained by `train`
    (a subprocess each by default; the test suite's trainer runs the same CLI in its own process)."""
    rows = []
    for i in range(runs):
        for name in names:
            sc = SCENARIOS[name]
            out = workdir / f"{name}-{i}"
            shutil.rmtree(out, ignore_errors=True)
            try:
                job_dir, wall = train(job, out, nproc, device, steps, sc.inject(step_ms), (*extra_sets, *sc.sets))
            except (RuntimeError, subprocess.TimeoutExpired) as e:  # one failed run must not lose the rest
                rows.append({"scenario": name, "run": i, "ok": False, "label": "error", "error": str(e)[-2000:],
                             "coverage_min": None, "step_ms": None, "stragglers": [], "live_flags": []})
                log(json.dumps({"scenario": name, "run": i, "error": str(e)[-300:]}))
                continue
            row = judge(sc, job_dir)
            row.update(run=i, wall_s=round(wall, 1), inject=sc.inject(step_ms))
            rows.append(row)
            log(json.dumps({k: row[k] for k in ("scenario", "run", "label", "ok", "coverage_min", "stragglers",
                                                 "live_flags", "step_ms")}))
            if not keep:
                shutil.rmtree(out, ignore_errors=True)
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario: right labels, flags in time, false stragglers, worst span coverage."""
    out = []
    for name in dict.fromkeys(r["scenario"] for r in rows):
        rs = [r for r in rows if r["scenario"] == name]
        s: dict[str, Any] = {"scenario": name, "runs": len(rs), "right_label": sum(r["ok"] for r in rs),
                             "labels": sorted({r["label"] for r in rs}),
                             "coverage_min": min((r["coverage_min"] for r in rs if r["coverage_min"] is not None),
                                                 default=None),
                             "step_ms_median": sorted(r["step_ms"] or 0 for r in rs)[len(rs) // 2]}
        if any("flagged_at" in r for r in rs):
            s["flagged_within_50"] = sum(bool(r.get("flagged_in_time")) for r in rs)
            s["flagged_at"] = [r.get("flagged_at") for r in rs]
        if any("false_straggler" in r for r in rs):
            s["false_stragglers"] = sum(r["false_straggler"] for r in rs)
        out.append(s)
    return out


def markdown(summary: list[dict[str, Any]]) -> str:
    """The BENCHMARKS.md table."""
    lines = ["| scenario | runs | right label | labels seen | slow rank flagged <= 50 steps (first flag) | "
             "false stragglers | min span coverage |", "|---|---|---|---|---|---|---|"]
    for s in summary:
        flag = (f"{s['flagged_within_50']}/{s['runs']} ({', '.join(str(x) for x in s['flagged_at'])})"
                if "flagged_within_50" in s else "-")
        cov = f"{100 * s['coverage_min']:.1f} %" if s["coverage_min"] is not None else "-"
        lines.append(f"| {s['scenario']} | {s['runs']} | {s['right_label']}/{s['runs']} | {', '.join(s['labels'])} "
                     f"| {flag} | {s.get('false_stragglers', '-')} | {cov} |")
    return "\n".join(lines)
