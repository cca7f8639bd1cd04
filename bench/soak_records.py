"""What a chaos soak's job left behind, read back into per-fault recovery times and consistency checks.

bench/soak.py drives the job and notes, for each fault, when it struck; everything else comes from
the run's own records (no clock of the driver's is trusted for what the job did):

- `progress/a{launch}.{restart}.jsonl`: rank 0's attempt start (its `main()`), its first step's start
  (`train_start`, with the step it resumed from) and a `{t, step}` line per optimizer step;
- `logs/torchrun.log`: torchrun's own lines, timestamped (`E1128 04:33:39.407000 ...`); with
  LOGLEVEL=INFO they include `Rendezvous'ing worker group` (the old ranks are gone: teardown ends);
- `logs/hang/hang-a*.json`, `logs/exits/a*-rank*.json`: when a hang, a NaN or an OOM was detected;
- `logs/rank0.log` (timestamped lines): a checkpoint that failed (`checkpoint ... failed`);
- `checkpoints/step-*/COMMITTED` (the marker's `time`), `state.json`: what was committed and when;
- `startup.jsonl`: rank 0's start-up marks (`model` -> `fit` is the checkpoint load of a resume);
- `numerics/applied.json`: a NaN's rollback (the checkpoints it quarantined are not "lost").

Recovery of one fault, split (seconds): detection (fault -> the system noticed), teardown (-> the old
ranks are gone), restart (-> the new attempt's rank 0 runs `main()`), reload (-> its first step starts:
imports, process group, model, checkpoint load), first step; lost steps (and the time they had taken)
are the work redone. `fault_to_step_s` is the whole: fault -> the next attempt's first step done.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Faults that end the attempt (a restart follows); `disk_full` fails one save and training goes on.
RESTARTING = frozenset({"kill", "hang", "nan", "oom", "torn", "preempt"})
#: Faults that change the numbers (a rollback past a NaN, a smaller batch): the weights differ from a run without.
NUMERIC = frozenset({"nan", "oom"})

_TORCHRUN_LINE = re.compile(r"^[IWE](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d+) .*?\] (.*)$")
_RANK_LOG_LINE = re.compile(r"^(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2}),(\d{3}) (.*)$")


@dataclass
class Attempt:
    """One attempt of the job (a launch's torchrun restart), from rank 0's progress file."""

    id: str
    start: float
    train_start: float | None = None
    resumed: int | None = None
    steps: list[tuple[float, int]] = field(default_factory=list)

    @property
    def reached(self) -> int | None:
        """The last optimizer step this attempt finished."""
        return self.steps[-1][1] if self.steps else None

    def first_step_done(self) -> float | None:
        """When its first optimizer step ended."""
        return self.steps[0][0] if self.steps else None

    def time_at(self, step: int) -> float | None:
        """When it finished `step` (its train_start when `step` is the one it resumed from)."""
        if self.resumed is not None and step <= self.resumed:
            return self.train_start
        return next((t for t, s in self.steps if s >= step), None)


def _key(attempt_id: str) -> tuple[int, int]:
    launch, _, restart = attempt_id.partition(".")
    return int(launch), int(restart)


def read_attempts(job_dir: Path) -> list[Attempt]:
    """Every attempt of the job, in order."""
    d = job_dir / "progress"
    out = []
    for p in sorted(d.glob("a*.jsonl"), key=lambda p: _key(p.stem[1:])) if d.is_dir() else []:
        a: Attempt | None = None
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by a SIGKILL
            if rec.get("event") == "start":
                a = Attempt(p.stem[1:], float(rec["t"]))
            elif a is not None and rec.get("event") == "train_start":
                a.train_start, a.resumed = float(rec["t"]), int(rec["step"])
            elif a is not None and "step" in rec and rec.get("event") is None:
                a.steps.append((float(rec["t"]), int(rec["step"])))
        if a is not None:
            out.append(a)
    return out


def torchrun_events(job_dir: Path, year: int) -> list[tuple[float, str]]:
    """(wall time, message) of torchrun's log lines (local time; the year is not in the line)."""
    path = job_dir / "logs" / "torchrun.log"
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []:
        m = _TORCHRUN_LINE.match(line)
        if m:
            mo, da, hh, mi, ss, frac, msg = m.groups()
            t = time.mktime((year, int(mo), int(da), int(hh), int(mi), int(ss), 0, 0, -1)) + float(f"0.{frac}")
            out.append((t, msg))
    return out


def rank_log_events(job_dir: Path, rank: int = 0) -> list[tuple[float, str]]:
    """(wall time, message) of a rank's log lines."""
    path = job_dir / "logs" / f"rank{rank}.log"
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []:
        m = _RANK_LOG_LINE.match(line)
        if m:
            y, mo, da, hh, mi, ss, ms, msg = m.groups()
            t = time.mktime((int(y), int(mo), int(da), int(hh), int(mi), int(ss), 0, 0, -1)) + int(ms) / 1000
            out.append((t, msg))
    return out


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _first_after(events: list[tuple[float, str]], t: float, pattern: str, slack: float = 0.05) -> float | None:
    rx = re.compile(pattern)
    return next((te for te, msg in events if te >= t - slack and rx.search(msg)), None)


def detection_time(job_dir: Path, kind: str, t: float, attempt: str | None, torchrun: list[tuple[float, str]],
                   rank0: list[tuple[float, str]]) -> float | None:
    """When the job noticed the fault that struck at `t` in `attempt`, from its own records."""
    if kind == "preempt":
        return t  # the signal itself is the news
    if kind in ("kill", "torn"):  # a rank died: torchrun's monitor sees its exit
        return _first_after(torchrun, t, r"failed \(exitcode|closing signal")
    if kind == "hang":
        rep = _json(job_dir / "logs" / "hang" / f"hang-a{attempt}.json")
        return float(rep["time"]) if isinstance(rep, dict) and "time" in rep else None
    if kind in ("nan", "oom"):
        want = "numerics" if kind == "nan" else "oom"
        times = [float(r["time"]) for p in (job_dir / "logs" / "exits").glob(f"a{attempt}-rank*.json")
                 if isinstance(r := _json(p), dict) and r.get("kind") == want and "time" in r]
        return min(times) if times else None
    if kind == "disk_full":
        return _first_after(rank0, t, r"checkpoint .* failed")
    return None


def _startup_marks(job_dir: Path, t0: float, t1: float, slack: float = 0.5) -> dict[str, float]:
    """Rank 0's start-up marks written between t0 and t1 (one attempt's)."""
    path = job_dir / "startup.jsonl"
    out: dict[str, float] = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if t0 - slack <= float(rec.get("time", 0)) <= t1 + slack:
            out.setdefault(str(rec.get("mark")), float(rec["time"]))
    return out


#: A restart and its reload, part by part (bench/soak.py's "where a restart's time goes"): (name, from, to), each a
#: rank 0 start-up mark (store/startup.py) or `down` (the old ranks gone), `spawn` (torchrun's `Starting worker
#: group`), `start` (the new attempt's main() began: progress file), `train` (its first step starts). Not the
#: `worker` mark: a process's creation time is read from /proc in whole seconds of boot time (off by up to 1 s).
RESTART_PARTS: tuple[tuple[str, str, str], ...] = (
    ("rendezvous_s", "down", "spawn"),      # torchrun's agent: its own re-rendezvous before it starts new ranks
    ("entry_s", "spawn", "start"),          # new interpreters, the entry's imports (worker.py), the pinning
    ("imports_s", "start", "imported"),     # torch and the rank's modules, the job record
    ("world_s", "imported", "world"),       # rendezvous of the ranks and the process group
    ("task_batch_s", "world", "batch"),     # watchdog, cores, the task (its imports, data sets), the batch
    ("model_s", "batch", "model"),          # model, DDP wrap (imports torch._dynamo), optimizer, loaders
    ("load_s", "model", "fit"),             # the checkpoint found (checksums) and loaded
    ("fit_s", "fit", "train"),              # metrics writer, loop set-up before the first step
)


def restart_parts(job_dir: Path, t_down: float, nxt: Attempt, torchrun: list[tuple[float, str]]
                  ) -> dict[str, float | None]:
    """Where one restart's time went, from rank 0's marks: each of RESTART_PARTS in seconds (None: a mark missing)."""
    if nxt.train_start is None:
        return {}
    marks = _startup_marks(job_dir, t_down, nxt.train_start, slack=0.05)
    marks.pop("worker", None)
    spawn = _first_after(torchrun, t_down, r"Starting worker group", slack=0.0)
    if spawn is not None and spawn <= nxt.start:
        marks["spawn"] = spawn
    marks.update(down=t_down, start=nxt.start, train=nxt.train_start)
    return {name: _r(marks[b] - marks[a]) if a in marks and b in marks else None for name, a, b in RESTART_PARTS}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def recovery(job_dir: Path, fault: dict[str, Any], attempts: list[Attempt], torchrun: list[tuple[float, str]],
             rank0: list[tuple[float, str]], commits: dict[int, float], launch_exit: float | None) -> dict[str, Any]:
    """One fault's detection, teardown, restart, reload, first step and lost work (see the module docstring)."""
    kind, t = fault["kind"], fault["t"]
    struck = next((a for a in reversed(attempts) if a.start <= t), None)
    out: dict[str, Any] = {"attempt": struck.id if struck else None}
    t_det = detection_time(job_dir, kind, t, out["attempt"], torchrun, rank0)
    out["detected"] = t_det is not None
    out["detection_s"] = _r(t_det - t) if t_det is not None else None
    nxt = next((a for a in attempts if a.start > t), None)
    if kind not in RESTARTING:
        later = sorted(ct for ct in commits.values() if ct > t)
        # A failed save must not end the attempt: a restart before the next commit is a finding (a silent restart).
        restarted = nxt is not None and (not later or nxt.start < later[0])
        out.update(restarted=restarted, next_commit_s=_r(later[0] - t) if later else None,
                   recovered=bool(later) and not restarted, lost_steps=0, lost_s=0.0)
        return out
    if nxt is None or nxt.train_start is None or not nxt.steps:
        out["recovered"] = False
        return out
    if kind == "preempt":
        t_down = launch_exit
    else:
        t_down = _first_after(torchrun, t_det or t, r"Rendezvous'ing worker group", slack=0.0)
    t_down = t_down if t_down is not None and t_down <= nxt.start else (t_det or t)
    marks = _startup_marks(job_dir, nxt.start, nxt.train_start)
    reached = struck.reached if struck else None
    resumed = nxt.resumed or 0
    t_resumed = struck.time_at(resumed) if struck else None
    out.update(
        recovered=True,
        teardown_s=_r(t_down - (t_det or t)),
        restart_s=_r(nxt.start - t_down),
        reload_s=_r(nxt.train_start - nxt.start),
        load_checkpoint_s=_r(marks["fit"] - marks["model"]) if "fit" in marks and "model" in marks else None,
        first_step_s=_r(nxt.first_step_done() - nxt.train_start),
        fault_to_step_s=_r(nxt.first_step_done() - t),
        failed_at_step=reached,
        resumed_from=resumed,
        lost_steps=max(0, (reached or 0) - resumed),
        lost_s=_r(max(0.0, t - t_resumed)) if t_resumed is not None and (reached or 0) > resumed else 0.0,
        next_attempt=nxt.id,
        parts=restart_parts(job_dir, t_down, nxt, torchrun),
    )
    return out


def productive_seconds(attempts: list[Attempt]) -> float:
    """Step time that survived: per attempt, its first step's start to the step the next attempt resumed from
    (the last attempt: its last step; the soak ended it, no fault destroyed its work)."""
    total = 0.0
    for i, a in enumerate(attempts):
        if a.train_start is None or not a.steps:
            continue
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        kept = a.reached if nxt is None or nxt.resumed is None else min(a.reached or 0, nxt.resumed)
        t_kept = a.time_at(kept) if kept is not None else None
        if t_kept is not None:
            total += max(0.0, t_kept - a.train_start)
    return total


def silent_restarts(attempts: list[Attempt], faults: list[dict[str, Any]]) -> list[str]:
    """Attempts after the first that no injected fault explains (each restarting fault claims the next one)."""
    claimed = {f["recovery"].get("next_attempt") for f in faults if f.get("recovery")}
    return [a.id for a in attempts[1:] if a.id not in claimed]


def lost_commits(faults: list[dict[str, Any]], commits: dict[int, float], job_dir: Path) -> list[str]:
    """Restarts that resumed from an older step than the newest checkpoint committed before the fault.

    A NaN's rollback may skip the checkpoints taken after the last finite loss (numerics/applied.json)."""
    applied = _json(job_dir / "numerics" / "applied.json") or []
    quarantined = {int(n.rsplit("-", 1)[1]) for rec in applied for n in rec.get("quarantined", [])}
    problems = []
    for f in faults:
        rec = f.get("recovery") or {}
        if not rec.get("recovered") or f["kind"] not in RESTARTING:
            continue
        before = [s for s, ct in commits.items() if ct < f["t"] and s not in quarantined]
        if f["kind"] == "nan":
            limit = min((int(r["last_good_step"]) for r in applied if r.get("last_good_step") is not None
                         and int(r["last_good_step"]) >= rec["resumed_from"]), default=None)
            before = [s for s in before if limit is None or s <= limit]
        newest = max(before, default=0)
        if rec["resumed_from"] < newest:
            problems.append(f"fault {f['n']} ({f['kind']}): resumed from step {rec['resumed_from']}, but step "
                            f"{newest} had been committed before it struck")
    return problems


def checkpoint_checks(job_dir: Path, steps_per_epoch: int | None) -> dict[str, Any]:
    """Every committed checkpoint loads (marker, sizes, SHA-256, every tensor read) and its step and data
    position agree: step == epoch x steps_per_epoch + samples / (global batch / world size)."""
    from musubi.checkpoint.checkpoint import STATE_FILE, committed_checkpoints, read_full_state

    rows, problems = [], []
    for c in committed_checkpoints(job_dir / "checkpoints", warn=False):
        row: dict[str, Any] = {"step": c.step}
        try:
            read_full_state(c.path)
            row["loads"] = True
        except Exception as e:  # noqa: BLE001 - a checkpoint that does not load is the finding
            row["loads"] = False
            problems.append(f"{c.path.name} does not load: {e}")
        state = _json(c.path / STATE_FILE) or {}
        per_step = int(state.get("global_batch", 0)) // max(1, int(c.marker.get("world_size", 1)))
        row.update(state_step=state.get("step"), epoch=state.get("epoch"), samples=state.get("samples"))
        if state.get("step") != c.step:
            problems.append(f"{c.path.name}: state.json says step {state.get('step')}")
        if steps_per_epoch and per_step and state.get("samples") is not None:
            expect = int(state["epoch"]) * steps_per_epoch + int(state["samples"]) // per_step
            row["position_ok"] = expect == c.step and int(state["samples"]) % per_step == 0
            if not row["position_ok"]:
                problems.append(f"{c.path.name}: epoch {state['epoch']}, {state['samples']} samples per rank "
                                f"make step {expect}, not {c.step}")
        rows.append(row)
    if not rows:
        problems.append("no committed checkpoint at the end")
    return {"checkpoints": rows, "problems": problems}


def median(xs: list[float | None]) -> float | None:
    """The median of the values that exist."""
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 3) if vals else None


SPLIT = ("detection_s", "teardown_s", "restart_s", "reload_s", "first_step_s", "fault_to_step_s", "lost_steps",
         "lost_s")


def by_kind(faults: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per fault kind: count, recovered, and the median of each part of the recovery."""
    out: dict[str, dict[str, Any]] = {}
    for kind in dict.fromkeys(f["kind"] for f in faults):
        fs = [f for f in faults if f["kind"] == kind and f.get("recovery")]
        out[kind] = {"faults": len(fs), "recovered": sum(bool(f["recovery"].get("recovered")) for f in fs),
                     **{k: median([f["recovery"].get(k) for f in fs]) for k in SPLIT}}
        if kind == "disk_full":
            out[kind]["next_commit_s"] = median([f["recovery"].get("next_commit_s") for f in fs])
    return out


def restart_split(faults: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median of each of RESTART_PARTS over every restart the soak saw (any fault kind: the restart is the same)."""
    parts = [f["recovery"]["parts"] for f in faults if (f.get("recovery") or {}).get("parts")]
    return {name: median([p.get(name) for p in parts]) for name, _, _ in RESTART_PARTS} if parts else {}
