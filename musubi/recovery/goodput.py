"""Goodput: how much of the wall time made progress that survived, and what each failure cost.

Inputs, all in the job directory:

- `progress/a{launch}.{restart}.jsonl`: rank 0's progress per attempt: start, resumed step, the
  first step's start, a `{t, step}` line per optimizer step (one unbuffered append, a few
  microseconds: it must survive a SIGKILL a moment later), and `end` when training finished;
- `heartbeat/a{attempt}-rank{r}.json`: every rank's last heartbeat (when it was last alive);
- `logs/hang/hang-a{attempt}.json`, `memory/applied-oom-*.json`: the causes that name themselves;
- `logs/torchrun.log`: torchrun's `failed (exitcode: -9) local_rank: 1 (pid: N)` lines, matched
  to a rank and attempt by the pids each heartbeat records (the rank's own, and the one torchrun
  started: the warm spare's client, when the spare forked the rank);
- `logs/exits/a{attempt}-rank{r}.json`: the error each failing rank recorded; a rank whose error
  says it lost a peer ("connection closed by peer") is a victim, and a rank that left no record
  while its peers did died without a word (SIGKILL, the kernel's OOM killer);
- `job.json` history: when each `musubi train` launch started and ended.

Definitions (written to `JOB/goodput.json`, shown by `musubi goodput` and `musubi drill`):

- productive time of an attempt: from its first step's start to the moment it reached the step
  that survived (the step the next attempt resumed from, or its last step);
- goodput = productive time / wall time (sum of the launches' durations);
- per failure: the steps lost (reached - resumed from), the time those steps had taken
  (`lost_s`), the downtime until the next attempt's first step (`downtime_s`, restart + setup +
  load) and the cause: a hang (with the rank named), an OOM, or the rank whose heartbeat went
  silent first (killed or crashed);
- a failure that repeats the one before it (the same exception at the same line, or the same
  crash signal: recovery/repeats.py) names it (`repeat_of`), and the record's `defect` says
  which attempts it struck: a defect, not a transient fault.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from musubi.contract.exits import EXIT_SPARE_GONE
from musubi.contract.exits import describe as describe_exit
from musubi.contract.records import ExitRecord, ProgressLine
from musubi.contract.run_files import RUN_FILES
from musubi.recovery.repeats import error_signature, mark_repeats, signal_signature
from musubi.store.rundir import read_jsonl

#: The file a checkpoint's commit writes last (checkpoint/checkpoint.py MARKER, not imported: it imports torch).
COMMIT_MARKER = "COMMITTED"
#: A rank whose heartbeat went silent this much before the others' is named as the one that died.
SILENT_MARGIN_S = 0.3


class ProgressLog:
    """Rank 0's progress of this attempt (appends of one line, each a single unbuffered write)."""

    def __init__(self, job_dir: Path, attempt: str, t_start: float) -> None:
        d = job_dir / RUN_FILES.progress
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / f"a{attempt}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._write(ProgressLine(event="start", t=round(t_start, 3), attempt=attempt))

    def _write(self, rec: ProgressLine) -> None:
        try:
            os.write(self._fd, (json.dumps(rec) + "\n").encode())
        except OSError:
            pass  # goodput bookkeeping never stops training

    def train_start(self, t: float, step: int) -> None:
        """The first step of this attempt starts (after setup and resume) at `step`."""
        self._write(ProgressLine(event="train_start", t=round(t, 3), step=step))

    def stepped(self, step: int) -> None:
        """Optimizer step `step` is done."""
        self._write(ProgressLine(t=round(time.time(), 3), step=step))

    def end(self, step: int) -> None:
        """Training of this attempt finished normally at `step`."""
        self._write(ProgressLine(event="end", t=round(time.time(), 3), step=step))
        os.close(self._fd)


def _attempt_key(name: str) -> tuple[int, int]:
    launch, _, restart = name.removeprefix("a").partition(".")
    return int(launch), int(restart)


def _reached_at(lines: list[dict[str, Any]], step: int) -> float | None:
    for rec in lines:
        if "step" in rec and rec.get("event") != "start" and int(rec["step"]) >= step:
            return float(rec["t"])
    return None


_EXIT_RE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")


def _pids(job_dir: Path) -> dict[int, tuple[str, int]]:
    """pid -> (attempt, rank), from every heartbeat file: the rank's own pid and the one torchrun knows it by (a
    rank forked by the warm spare: its client's)."""
    out = {}
    for p in (job_dir / RUN_FILES.heartbeat).glob("a*-rank*.json"):
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
            out[int(rec["pid"])] = out[int(rec.get("launched_pid", rec["pid"]))] = (str(rec["attempt"]),
                                                                                     int(rec["rank"]))
        except (ValueError, KeyError, OSError):
            continue
    return out


def _torchrun_exits(job_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """attempt -> [(rank, exit code)] of the ranks torchrun saw fail first."""
    log_path = job_dir / RUN_FILES.logs / RUN_FILES.torchrun_log
    if not log_path.is_file():
        return {}
    pids = _pids(job_dir)
    out: dict[str, list[tuple[int, int]]] = {}
    for m in _EXIT_RE.finditer(log_path.read_text(encoding="utf-8", errors="replace")):
        code, pid = int(m.group(1)), int(m.group(3))
        if pid in pids:
            attempt, rank = pids[pid]
            out.setdefault(attempt, []).append((rank, code))
    return out


#: Errors of a rank whose peer died: not the cause of the failure.
_VICTIM_RE = re.compile(r"[Cc]onnection (closed|reset) by peer|[Bb]roken pipe|communicator was aborted|"
                        r"NCCL Error 6|remote process exited|Socket Timeout")


def is_victim_error(err: str | None) -> bool:
    """Whether an error is a rank's report that it lost a peer (a victim of the failure, not its cause)."""
    return bool(err and _VICTIM_RE.search(err))


def _exit_records(job_dir: Path, attempt: str) -> dict[int, ExitRecord]:
    out = {}
    for p in (job_dir / RUN_FILES.exits).glob(f"a{attempt}-rank*.json"):
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
            out[int(rec["rank"])] = rec
        except (ValueError, KeyError, OSError):
            continue
    return out


def _heartbeat_ranks(job_dir: Path, attempt: str) -> list[int]:
    return sorted(int(p.stem.rsplit("rank", 1)[1]) for p in (job_dir / RUN_FILES.heartbeat).glob(f"a{attempt}-rank*.json"))


def _spare_death(job_dir: Path, t0: float) -> dict[str, Any] | None:
    """The launch this attempt ran in ended because its warm spare died (job.json history: the launcher's exit
    EXIT_SPARE_GONE and its line): the agent and the ranks died with the spare, so no rank named itself."""
    try:
        history = json.loads((job_dir / RUN_FILES.job).read_text(encoding="utf-8")).get("history", [])
    except (OSError, ValueError):
        return None
    for h in history:
        if h.get("exit_code") == EXIT_SPARE_GONE and float(h.get("started", 0)) - 5 <= t0 <= float(h.get("ended", 0)):
            return {"cause": "spare died", "ranks": [], "detail": str(h.get("error") or "the warm spare died")}
    return None


def _cause(job_dir: Path, attempt: str, t0: float, t1: float, exits: dict[str, list[tuple[int, int]]]
           ) -> dict[str, Any]:
    hang = job_dir / RUN_FILES.hangs / f"hang-a{attempt}.json"
    if hang.is_file():
        rec = json.loads(hang.read_text(encoding="utf-8"))
        return {"cause": "hang", "ranks": rec.get("culprits", []), "detail": rec.get("message")}
    signalled = sorted({r for r, code in exits.get(attempt, []) if code < 0})
    if signalled:
        code = next(c for r, c in exits[attempt] if r == signalled[0])
        out = {"cause": "killed", "ranks": signalled,
               "detail": f"rank(s) {', '.join(map(str, signalled))}: {describe_exit(code)} (torchrun)"}
        sig = signal_signature(code)
        return {**out, "signature": sig} if sig else out
    spare = _spare_death(job_dir, t0)
    if spare is not None:
        return spare
    records = _exit_records(job_dir, attempt)
    own = {r: rec for r, rec in records.items() if not _VICTIM_RE.search(rec.get("message", ""))}
    if own:
        r0 = min(own)
        rec = own[r0]
        kind = rec.get("kind")
        # A NaN's exit is its own cause (a rollback in a safer precision follows), not a crash.
        out = {"cause": kind if kind in ("oom", "numerics") else "error", "ranks": sorted(own),
               "detail": f"rank {r0}: {rec.get('message', '')[:200]}"}
        if rec.get("ours") or rec.get("site"):  # where it was raised (worker's exit record)
            out["site"] = rec.get("ours") or rec.get("site")
        sig = error_signature(kind, str(rec.get("message", "")), rec.get("site"), rec.get("ours"))
        return {**out, "signature": sig} if sig else out
    ranks = _heartbeat_ranks(job_dir, attempt)
    if records and ranks:
        # Every rank that left a record was a victim of a lost peer: the culprits left none.
        silent = sorted(set(ranks) - set(records))
        if silent:
            return {"cause": "rank died", "ranks": silent,
                    "detail": f"rank(s) {', '.join(map(str, silent))} died without an error (killed by a signal "
                              "or the OOM killer); the others lost their connection to it"}
    mem = job_dir / RUN_FILES.memory
    for p in sorted(mem.glob("*oom-*.json")) if mem.is_dir() else []:
        rec = json.loads(p.read_text(encoding="utf-8"))
        if t0 <= float(rec.get("time", 0)) <= t1 + 5:
            return {"cause": "oom", "ranks": [rec.get("rank")], "detail": f"out of memory in {rec.get('phase')}"}
    beats = {}
    for p in (job_dir / RUN_FILES.heartbeat).glob(f"a{attempt}-rank*.json"):
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except ValueError:
            continue
        beats[int(rec["rank"])] = float(rec["time"])
    if beats:
        first = min(beats.values())
        silent = sorted(r for r, t in beats.items() if t <= first + SILENT_MARGIN_S)
        if len(silent) < len(beats):
            return {"cause": "rank died", "ranks": silent,
                    "detail": f"rank(s) {', '.join(map(str, silent))} went silent first (killed or crashed)"}
    return {"cause": "unknown", "ranks": [], "detail": "no rank named itself; see logs/torchrun.log"}


def _committed_step(job_dir: Path, at_most: int) -> int:
    """The newest committed checkpoint step <= `at_most` (its marker names the step; no sizes, no checksums); 0 if
    none. Read without the checkpoint module, which imports torch: the launcher runs this after every launch, a
    preempted one's included, where importing torch took 7-12 s of the exit on a loaded 2-core machine
    (bench/soak.py)."""
    steps = []
    for marker in (job_dir / RUN_FILES.checkpoints).glob(f"step-*/{COMMIT_MARKER}"):
        try:
            step = int(json.loads(marker.read_text(encoding="utf-8"))["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if marker.parent.name == f"step-{step:09d}" and step <= at_most:
            steps.append(step)
    return max(steps, default=0)


def failure_summary(f: dict[str, Any]) -> str:
    """One failure in words: its cause, the rank(s) it names and the detail, e.g. for an error line."""
    ranks = f.get("ranks") or []
    who = f" (rank {', '.join(map(str, ranks))})" if ranks else ""
    detail = f.get("detail") or ""
    site = f" at {f['site']}" if f.get("site") else ""
    return f"{f.get('cause', 'unknown')}{who}" + (f": {detail}" if detail else "") + site


def attempt_failure(job_dir: Path, attempt: str) -> dict[str, Any]:
    """How one ended attempt failed, from its records: the step it reached, its end time and its cause."""
    path = job_dir / RUN_FILES.progress / f"a{attempt}.jsonl"
    lines = read_jsonl(path) if path.is_file() else []
    steps = [int(r["step"]) for r in lines if "step" in r and r.get("event") != "start"]
    end = _attempt_end(job_dir, attempt, lines) if lines else time.time()
    start = float(lines[0]["t"]) if lines else end
    return {"reached_step": max(steps, default=0), "end": end,
            **_cause(job_dir, attempt, start, end, _torchrun_exits(job_dir))}


def repeated_failure(job_dir: Path, launch: int, restart: int) -> dict[str, Any] | None:
    """At the start of attempt `launch.restart`: the defect when its two predecessors failed the same way."""
    if restart < 2:
        return None
    return defect_of([{"attempt": a, **attempt_failure(job_dir, a)}
                      for a in (f"{launch}.{restart - 2}", f"{launch}.{restart - 1}")])


def defect_of(failures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Mark the failures that repeat the one before them (`repeat_of`); the defect they make, cause in words."""
    defect = mark_repeats(failures)
    if defect is not None:
        last = defect.pop("last")
        defect["cause"] = failure_summary({k: last.get(k) for k in ("cause", "ranks", "detail", "site")})
    return defect


def _attempt_end(job_dir: Path, attempt: str, lines: list[dict[str, Any]]) -> float:
    times = [float(r["t"]) for r in lines]
    for p in (job_dir / RUN_FILES.heartbeat).glob(f"a{attempt}-rank*.json"):
        try:
            times.append(float(json.loads(p.read_text(encoding="utf-8"))["time"]))
        except (ValueError, KeyError):
            continue
    return max(times)


def compute_goodput(job_dir: Path) -> dict[str, Any]:
    """The goodput record of a job directory (see the module docstring)."""
    d = job_dir / RUN_FILES.progress
    files = sorted(d.glob("a*.jsonl"), key=lambda p: _attempt_key(p.stem)) if d.is_dir() else []
    attempts = []
    for p in files:
        lines = read_jsonl(p)
        if not lines:
            continue
        aid = p.stem.removeprefix("a")
        start = next((r for r in lines if r.get("event") == "start"), lines[0])
        train = next((r for r in lines if r.get("event") == "train_start"), None)
        steps = [int(r["step"]) for r in lines if "step" in r]
        attempts.append({"attempt": aid, "start": float(start["t"]), "end": _attempt_end(job_dir, aid, lines),
                         "train_start": float(train["t"]) if train else None,
                         "resumed_step": int(train["step"]) if train else None,
                         "reached_step": max(steps) if steps else None,
                         "finished": any(r.get("event") == "end" for r in lines), "lines": lines})
    failures, productive = [], 0.0
    exits = _torchrun_exits(job_dir)
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        reached = a["reached_step"]
        kept = reached
        if nxt is not None and nxt["resumed_step"] is not None and reached is not None:
            kept = min(reached, nxt["resumed_step"])
        elif nxt is None and not a["finished"] and reached is not None:
            # The attempt that ended the job: only what its newest committed checkpoint holds survived.
            kept = max(a["resumed_step"] or 0, min(reached, _committed_step(job_dir, reached)))
        if a["train_start"] is not None and kept is not None and a["resumed_step"] is not None \
                and kept > a["resumed_step"]:
            t_kept = _reached_at(a["lines"], kept) or a["end"]
            productive += max(0.0, t_kept - a["train_start"])
        if a["finished"]:
            continue
        if nxt is None:
            # The failure that ended the job (restarts ran out, or a configuration error): no next attempt.
            t_kept = _reached_at(a["lines"], kept) if kept is not None and kept > (a["resumed_step"] or 0) \
                else a["train_start"]
            failures.append({"attempt": a["attempt"], "failed_at_step": reached, "resumed_from_step": None,
                             "lost_steps": max(0, (reached or 0) - (kept or 0)),
                             "lost_s": round(max(0.0, a["end"] - (t_kept or a["end"])), 3),
                             "downtime_s": None,
                             **_cause(job_dir, a["attempt"], a["start"], a["end"], exits)})
            continue
        same_launch = _attempt_key(nxt["attempt"])[0] == _attempt_key(a["attempt"])[0]
        resumed = nxt["resumed_step"] if nxt["resumed_step"] is not None else 0
        t_resumed = _reached_at(a["lines"], resumed) if resumed > (a["resumed_step"] or 0) else a["train_start"]
        failure = {"attempt": a["attempt"], "failed_at_step": reached, "resumed_from_step": resumed,
                   "lost_steps": max(0, (reached or 0) - resumed),
                   "lost_s": round(max(0.0, a["end"] - (t_resumed or a["end"])), 3),
                   "downtime_s": round(nxt["train_start"] - a["end"], 3) if nxt["train_start"] and same_launch
                   else None,
                   **_cause(job_dir, a["attempt"], a["start"], a["end"], exits)}
        failures.append(failure)
    defect = defect_of(failures)
    wall = _wall_seconds(job_dir, attempts)
    # From the first step on: what the failures cost, without the one-time startup.
    first_train = next((a["train_start"] for a in attempts if a["train_start"] is not None), None)
    last_end = max((a["end"] for a in attempts), default=None)
    training_wall = (last_end - first_train) if first_train is not None and last_end is not None else 0.0
    return {
        "goodput": round(productive / wall, 4) if wall > 0 else None,
        "training_goodput": round(min(1.0, productive / training_wall), 4) if training_wall > 0 else None,
        "productive_s": round(productive, 3),
        "wall_s": round(wall, 3),
        # Each attempt's start-up before its first step: imports, process group, data, model, resume.
        "startup_s": round(sum(a["train_start"] - a["start"] for a in attempts if a["train_start"] is not None), 3),
        "attempts": len(attempts),
        "failures": failures,
        "lost_steps": sum(f["lost_steps"] for f in failures),
        "lost_s": round(sum(f["lost_s"] for f in failures), 3),
        "downtime_s": round(sum(f["downtime_s"] or 0.0 for f in failures), 3),
        "defect": defect,
        "how": "productive = first step's start to the last step that survived, per attempt; wall = the "
               "launches' durations (job.json history) or first start to last heartbeat",
    }


def _wall_seconds(job_dir: Path, attempts: list[dict[str, Any]]) -> float:
    """Sum of the launches' durations from job.json history; else first start to last heartbeat per launch."""
    try:
        history = json.loads((job_dir / RUN_FILES.job).read_text(encoding="utf-8")).get("history", [])
    except (OSError, ValueError):
        history = []
    spans = [float(h["ended"]) - float(h["started"]) for h in history if "started" in h and "ended" in h]
    if spans and len(spans) >= len({_attempt_key(a["attempt"])[0] for a in attempts}):
        return sum(spans)
    by_launch: dict[int, list[dict[str, Any]]] = {}
    for a in attempts:
        by_launch.setdefault(_attempt_key(a["attempt"])[0], []).append(a)
    return sum(max(a["end"] for a in group) - min(a["start"] for a in group) for group in by_launch.values())


def write_goodput(job_dir: Path) -> dict[str, Any] | None:
    """Compute and write `JOB/goodput.json`; None when the job left no progress records."""
    if not (job_dir / RUN_FILES.progress).is_dir():
        return None
    rec = compute_goodput(job_dir)
    tmp = job_dir / "goodput.json.tmp"
    tmp.write_text(json.dumps(rec, indent=1), encoding="utf-8")
    tmp.replace(job_dir / RUN_FILES.goodput)
    return rec


def goodput_line(rec: dict[str, Any]) -> str:
    """One line for the console: ratio, failures, work lost."""
    g = rec.get("goodput")
    ratio = f"{g:.1%}" if isinstance(g, (int, float)) else "n/a"
    n = len(rec.get("failures", []))
    causes = ", ".join(f"{f['cause']}" + (f" (rank {','.join(map(str, f['ranks']))})" if f.get("ranks") else "")
                       for f in rec.get("failures", []))
    defect = rec.get("defect")
    return (f"goodput {ratio} of {rec.get('wall_s', 0):.1f}s wall; {n} failure(s)"
            + (f": {causes}; {rec['lost_steps']} step(s) lost ({rec['lost_s']:.1f}s), "
               f"{rec['downtime_s']:.1f}s down" if n else "")
            + (f"; a defect: the same failure struck attempts {', '.join(defect['attempts'])}"
               if isinstance(defect, dict) and defect.get("attempts") else ""))
