"""`musubi drill JOB.yaml --faults kill,hang,ckpt_kill --repeat N`: a job trained under injected faults.

First an uninterrupted reference run (or a finished one named by `--reference`, refused unless it
is the same job, world and stack and intact: drill_reference.py), then `repeat` runs per fault,
each with one fault drawn at random (rank, step, and for `ckpt_kill` a checkpoint step and phase)
and injected through `MUSUBI_INJECT`, the same mechanism as the tests. Every run is checked:

- it finished (torchrun restarted it, the workers resumed on their own);
- its final weights and optimizer state equal the reference's, bit for bit (the drill sets
  `train.deterministic=true`);
- `kill`: the fault fired; `ckpt_kill`: the killed save was never loaded (the resume took an
  earlier committed checkpoint); `hang`: the hang report names the injected rank and the stall
  was detected within the timeout + 30 s;

and its goodput record gives the recovery time (failure to the next attempt's first step),
the work lost and the effective training time ratio. Figures go to the console and `OUT/drill.json`.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musubi.contract.env import MUSUBI_INJECT
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.launch.drill_reference import (  # noqa: F401  (flatten_tensors: the drill's public helpers stay here too)
    Reference,
    final_tensors,
    flatten_tensors,
    identity,
    load_reference,
    same_weights,
    write_reference,
)
from musubi.store.rundir import read_jsonl

FAULTS = ("kill", "hang", "ckpt_kill")
#: Slack allowed between a hang's timeout and its detection (the issue's bar).
HANG_SLACK_S = 30.0


@dataclass
class DrillRequest:
    """What `musubi drill` was asked."""

    job_path: Path
    faults: list[str]
    repeat: int = 1
    nproc: int | None = None
    out: Path | None = None
    device: str | None = None
    overrides: list[str] = field(default_factory=list)
    seed: int = 0
    reference: Path | None = None  # a finished drill's reference to compare against (none: train one)


def parse_faults(text: str) -> list[str]:
    """`kill,hang` -> ['kill', 'hang']; ConfigError on an unknown name."""
    names = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in names if f not in FAULTS]
    if not names or bad:
        raise ConfigError(f"--faults {text!r}: use a comma list of {', '.join(FAULTS)}")
    return names


def _train(req: DrillRequest, out: Path, inject: str | None, deadline_s: float | None = None
           ) -> tuple[int, Path, str | None]:
    from musubi.launch.launch import launch_train
    from musubi.launch.request import TrainRequest

    treq = TrainRequest(job_path=req.job_path, nproc=req.nproc, out=out, device=req.device,
                        overrides=[*req.overrides, "train.deterministic=true"], check=False, quiet=True,
                        argv=["musubi", "drill"], deadline_s=deadline_s)
    old = os.environ.get(MUSUBI_INJECT)
    try:
        if inject:
            os.environ[MUSUBI_INJECT] = inject
        else:
            os.environ.pop(MUSUBI_INJECT, None)
        res = launch_train(treq)
    finally:
        if old is None:
            os.environ.pop(MUSUBI_INJECT, None)
        else:
            os.environ[MUSUBI_INJECT] = old
    return res.code, res.job_dir, res.error


def _draw(kind: str, rng: random.Random, nproc: int, total: int, ckpt_steps: list[int]) -> tuple[str, dict]:
    """One random fault of `kind`: its MUSUBI_INJECT spec and what was drawn."""
    rank = rng.randrange(nproc)
    if kind == "ckpt_kill":
        step = rng.choice(ckpt_steps)
        phase = rng.choice(["write", "commit"])
        if phase == "commit":
            rank = 0  # the committer (asynchronous saves commit on rank 0)
        return f"ckpt_kill:rank={rank},step={step},phase={phase}", {"rank": rank, "step": step, "phase": phase}
    step = rng.randint(1, max(1, total - 1))
    return f"{kind}:rank={rank},step={step}", {"rank": rank, "step": step}


def _resumed_steps(job_dir: Path) -> list[int]:
    """Steps of the checkpoints each restart loaded (rank 0's log)."""
    text = (job_dir / RUN_FILES.logs / RUN_FILES.rank_log(0)).read_text(encoding="utf-8", errors="replace") \
        if (job_dir / RUN_FILES.logs / RUN_FILES.rank_log(0)).is_file() else ""
    import re

    return [int(m.group(1)) for m in re.finditer(r"resumed from step-(\d+)", text)]


def _check(kind: str, drawn: dict, job_dir: Path, code: int, ref: dict[str, Any], err: str | None = None,
           deadline_s: float | None = None) -> dict[str, Any]:
    good = json.loads((job_dir / RUN_FILES.goodput).read_text(encoding="utf-8")) \
        if (job_dir / RUN_FILES.goodput).is_file() else {}
    summary = json.loads((job_dir / RUN_FILES.summary).read_text(encoding="utf-8")) \
        if (job_dir / RUN_FILES.summary).is_file() else {}
    fired = any((job_dir / RUN_FILES.inject).glob("fired-*")) if (job_dir / RUN_FILES.inject).is_dir() else False
    row: dict[str, Any] = {"fault": kind, **drawn, "exit_code": code, "finished": bool(summary.get("finished")),
                           "fired": fired, "failures": len(good.get("failures", [])),
                           "goodput": good.get("goodput"), "training_goodput": good.get("training_goodput"),
                           "recovery_s": [f["downtime_s"] for f in good.get("failures", [])
                                          if f.get("downtime_s") is not None],
                           "lost_steps": good.get("lost_steps")}
    row["weights_equal"] = row["finished"] and same_weights(final_tensors(job_dir), ref)
    problems = []
    if not row["finished"]:
        if err and "(deadline)" in err:
            problems.append(f"did not finish within {deadline_s:.0f} s (the drill's deadline): ended")
        else:
            problems.append(f"did not finish (exit {code})")
    if not fired:
        problems.append("the fault never fired")
    if not row["weights_equal"]:
        problems.append("final weights differ from the reference")
    if kind == "ckpt_kill":
        resumed = _resumed_steps(job_dir)
        row["resumed_from"] = resumed
        if drawn["step"] in resumed:
            problems.append(f"loaded the killed checkpoint of step {drawn['step']}")
    if kind == "hang":
        hangs = sorted((job_dir / RUN_FILES.hangs).glob("hang-a*.json")) if (job_dir / RUN_FILES.hangs).is_dir() \
            else []
        rep = json.loads(hangs[0].read_text(encoding="utf-8")) if hangs else {}
        named = rep.get("culprits") == [drawn["rank"]]
        culprit = rep.get("ranks", {}).get(str(drawn["rank"]), {})
        # From the moment the rank stopped (the fault's own marker) to the hang report, by the file clock:
        # not the watchdog's own measure of the stall.
        marks = list((job_dir / RUN_FILES.inject).glob(f"fired-*-rank{drawn['rank']}")) \
            if (job_dir / RUN_FILES.inject).is_dir() else []
        detect = round(float(rep["time"]) - min(m.stat().st_mtime for m in marks), 2) \
            if marks and isinstance(rep.get("time"), (int, float)) else None
        timeout = float(culprit.get("timeout_s", 0) or 0)
        row.update(named=named, detected_after_s=detect, timeout_s=timeout)
        if not hangs:
            problems.append("no hang report")
        elif not named:
            problems.append(f"hang report names {rep.get('culprits')}, not rank {drawn['rank']}")
        elif detect is None or detect > timeout + HANG_SLACK_S:
            problems.append(f"hang detected after {detect}s > timeout {timeout}s + {HANG_SLACK_S:.0f}s")
    row["ok"] = not problems
    row["problems"] = problems
    return row


def _prepare(req: DrillRequest) -> tuple[Any, int, Path, dict[str, Any]]:
    """(job spec, ranks, drill folder, the reference's identity), every refusal before anything is written."""
    from musubi.config.load import load_job
    from musubi.launch.ranks import resolve_world
    from musubi.store.rundir import default_run_dir

    spec = load_job(req.job_path, req.overrides)
    if not spec.checkpoint.enabled:
        raise ConfigError("the drill needs checkpoints: set checkpoint.enabled: true")
    if spec.train.max_restarts < 1:
        raise ConfigError("the drill needs restarts: set train.max_restarts >= 1")
    nproc, device_kind = resolve_world(req.nproc, req.device)
    out = req.out or default_run_dir(f"drill-{spec.name}")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} already exists and is not empty; choose another --out")
    # The reference run is trained with the drill's own override, so that is the job it must match.
    ident = identity(load_job(req.job_path, [*req.overrides, "train.deterministic=true"]), nproc, device_kind)
    return spec, nproc, out, ident


def train_reference(req: DrillRequest, progress: Any = None) -> Reference:
    """Only the reference run, recorded in OUT/reference: what later drills reuse with `--reference OUT`."""
    _spec, _nproc, out, ident = _prepare(req)
    out.mkdir(parents=True, exist_ok=True)
    return _reference_run(req, out / "reference", ident, progress or (lambda _msg: None))


def run_drill(req: DrillRequest, progress: Any = None) -> dict[str, Any]:
    """Reference run, then `repeat` faulted runs per fault; the figures (also written to OUT/drill.json)."""
    if req.repeat < 1:
        raise ConfigError(f"--repeat {req.repeat}: must be >= 1")
    spec, nproc, out, ident = _prepare(req)
    given = load_reference(req.reference, ident) if req.reference else None  # refused before anything is written
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _msg: None)
    if given is not None:
        say(f"reference run: {given.job_dir.parent} (same job, world and stack; final tensors intact)")
    reference = given or _reference_run(req, out / "reference", ident, say)
    # Each faulted run: up to 3 x the reference, plus the hang timeout's floor and a minute, then it is ended.
    deadline = 3 * reference.wall_s + spec.watchdog.floor_s + 60
    ref, total, ckpt_steps, ref_dir = reference.tensors, reference.total_steps, reference.ckpt_steps, reference.job_dir
    rng = random.Random(req.seed)
    rows = []
    for kind in req.faults:
        for i in range(req.repeat):
            spec_str, drawn = _draw(kind, rng, nproc, total, ckpt_steps)
            run_out = out / f"{kind}-{i:03d}"
            code, job_dir, err = _train(req, run_out, spec_str, deadline)
            row = _check(kind, drawn, job_dir, code, ref, err, deadline)
            row["inject"] = spec_str
            row["run"] = str(run_out)
            rows.append(row)
            say(f"{kind} {i + 1}/{req.repeat}: {spec_str} -> " + ("ok" if row["ok"] else "; ".join(row["problems"])))
    result = {"job": str(req.job_path), "nproc": nproc, "repeat": req.repeat, "total_steps": total,
              "reference": str(ref_dir), "reference_reused": given is not None, "summary": summarize(rows),
              "runs": rows}
    (out / "drill.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    result["out"] = str(out)
    return result


def _reference_run(req: DrillRequest, ref_run: Path, ident: dict[str, Any], say: Any) -> Reference:
    """Train the uninterrupted run every faulted run is compared with, and record it for later drills."""
    say(f"reference run (no fault) in {ref_run}")
    t_ref = time.monotonic()
    code, ref_dir, err = _train(req, ref_run, None)
    if code != 0:
        raise ConfigError(f"the reference run failed ({err}); fix the job before drilling it")
    total = int(json.loads((ref_dir / RUN_FILES.summary).read_text(encoding="utf-8"))["total_steps"])
    ckpt_steps = sorted({int(r["step"]) for r in read_jsonl(ref_dir / RUN_FILES.metrics)
                         if r.get("kind") == "checkpoint" and r["step"] < total}) or [total]
    ref = Reference(ref_dir, total, ckpt_steps, time.monotonic() - t_ref, final_tensors(ref_dir))
    write_reference(ref_run, ident, ref)
    return ref


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per fault: runs, success rate, weights equal, recovery time, goodput, and the fault's own check."""
    out: dict[str, dict[str, Any]] = {}
    for kind in dict.fromkeys(r["fault"] for r in rows):
        rs = [r for r in rows if r["fault"] == kind]
        rec = [s for r in rs for s in r["recovery_s"]]
        goods = [r["goodput"] for r in rs if r["goodput"] is not None]
        tgoods = [r["training_goodput"] for r in rs if r["training_goodput"] is not None]
        fig: dict[str, Any] = {
            "runs": len(rs),
            "success_rate": round(sum(r["ok"] for r in rs) / len(rs), 4),
            "weights_equal": sum(r["weights_equal"] for r in rs),
            "recovery_s_median": round(statistics.median(rec), 2) if rec else None,
            "recovery_s_max": round(max(rec), 2) if rec else None,
            "goodput_mean": round(statistics.mean(goods), 4) if goods else None,
            "training_goodput_mean": round(statistics.mean(tgoods), 4) if tgoods else None,
            "lost_steps_mean": round(statistics.mean(r["lost_steps"] or 0 for r in rs), 2),
        }
        if kind == "ckpt_kill":
            fig["partial_loads"] = sum(1 for r in rs if r["step"] in r.get("resumed_from", []))
        if kind == "hang":
            det = [r["detected_after_s"] for r in rs if r.get("detected_after_s") is not None]
            fig["named"] = sum(bool(r.get("named")) for r in rs)
            fig["detected_after_s_max"] = round(max(det), 2) if det else None
            fig["timeout_s"] = max((r.get("timeout_s") or 0 for r in rs), default=None)
        out[kind] = fig
    return out
