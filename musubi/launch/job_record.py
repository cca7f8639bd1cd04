"""RUN/JOB/job.json as the launcher keeps it: opened before torchrun starts, one history entry per launch after.

The entry says how the launch ended (exit code, status, the first rank's error), what torchrun's restarts
and the OOM guard did inside it, and, through the goodput record, each failure's cause: the rank that died
or hung rather than the peer that saw its connection drop, and a defect when the same cause struck again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from musubi.contract.run_files import RUN_FILES
from musubi.data.job_version import dataset_env
from musubi.store.db import db_path
from musubi.store.rundir import env_record, read_json, run_record, write_json


def open_record(run_dir: Path, job_dir: Path, config: dict[str, Any], *, attempts: int, nproc: int, kind: str,
                resume: bool, nnodes: int, preflight: Any, fleet_member: bool, before: dict[str, Any],
                changes: list[dict[str, Any]], argv: list[str], from_start: bool = False) -> dict[str, Any]:
    """Write RUN/run.json and env.json (a lone job's), RUN/preflight.json, and job.json with status running
    (`from_start`: a --resume with no committed checkpoint, which trains from step 0 in the same folder)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    if preflight is not None:
        write_json(run_dir / RUN_FILES.preflight, preflight.to_dict())
    if not fleet_member:
        if not resume or not (run_dir / RUN_FILES.run).exists():
            write_json(run_dir / RUN_FILES.run, run_record({"jobs": [config]}, argv))
        write_json(run_dir / RUN_FILES.env, {**env_record(), **dataset_env([config], db_path(run_dir))})
    record: dict[str, Any] = {
        "config": config, "status": "running", "attempts": attempts, "nproc": nproc, "device": kind,
        "resume": resume, "nnodes": nnodes, **({"from_start": True} if from_start else {}),
        "preflight": "skipped (--no-check)" if preflight is None else
        ("passed with warnings" if preflight.warnings else "passed")}
    prev = job_dir / RUN_FILES.job
    if prev.is_file():
        record["history"] = read_json(prev).get("history", [])
    # What a resume changed, and when: job.json's config is the newest, this says what it replaced.
    all_changes = list(before.get("changes", [])) + [{"attempt": attempts, **c} for c in changes]
    if all_changes:
        record["changes"] = all_changes
    write_json(job_dir / RUN_FILES.job, record)
    return record


def _restarts_and_ooms(job_dir: Path, attempt: int, entry: dict[str, Any]) -> None:
    """torchrun's restarts of this launch (one progress file per attempt) and the OOM guard's recoveries."""
    summary_path = job_dir / RUN_FILES.summary
    progress = job_dir / RUN_FILES.progress
    attempts_here = list(progress.glob(f"a{attempt}.*.jsonl")) if progress.is_dir() else []
    if attempts_here:
        entry["restarts"] = len(attempts_here) - 1
    elif summary_path.is_file():  # a failed launch writes no summary
        entry["restarts"] = read_json(summary_path).get("restarts", 0)
    memory = job_dir / RUN_FILES.memory
    oom_records = sorted(memory.glob("applied-oom-*.json")) if memory.is_dir() else []
    if oom_records:
        entry["oom_recoveries"] = [read_json(p) for p in oom_records]


def _failures(job_dir: Path, attempt: int, entry: dict[str, Any], err: str | None, err_kind: str | None,
              failed: bool) -> str | None:
    """Each failure's cause from the goodput record (written now); the error the launch reports."""
    from musubi.recovery.goodput import failure_summary, is_victim_error, write_goodput
    from musubi.recovery.repeats import defect_line

    good = write_goodput(job_dir)  # reads the history just written
    if good is None:
        return err
    # Each failure's cause (hang with its rank, OOM, the rank that died first) for the fleet.
    mine = [f for f in good["failures"] if f["attempt"].startswith(f"{attempt}.")]
    entry["failures"] = [{k: f[k] for k in ("attempt", "cause", "ranks", "lost_steps", "detail", "site",
                                            "repeat_of") if k in f} for f in mine]
    entry["goodput"] = good["goodput"]
    if failed and mine and mine[-1]["resumed_from_step"] is None and mine[-1]["cause"] != "unknown" \
            and (err_kind is None or is_victim_error(err)):
        # The rank that died or hung, not the peer that saw its connection drop.
        err = entry["error"] = f"attempt {mine[-1]['attempt']} failed: {failure_summary(mine[-1])}"
    defect = good.get("defect")
    if defect and str(defect["attempts"][-1]).startswith(f"{attempt}."):
        # The same cause struck again after a restart: the launch failed of a defect (recovery/repeats.py).
        entry["defect"] = defect_line(job_dir.name, defect)
        if failed:
            err = entry["error"] = entry["defect"]
    return err


def close_attempt(job_dir: Path, record: dict[str, Any], *, code: int, status: str, err: str | None,
                  err_kind: str | None, started: float, timed_out: bool, probe_only: bool) -> str | None:
    """Append this launch to job.json's history (status, restarts, OOM recoveries, failure causes); return the
    error the launch reports (a failure's cause may name it better than the first rank's message)."""
    summary_path = job_dir / RUN_FILES.summary
    if code == 0 and summary_path.is_file() and not read_json(summary_path).get("finished"):
        status = "stopped"
    entry: dict[str, Any] = {"attempt": record["attempts"], "exit_code": code, "status": status, "error": err,
                             "started": round(started, 3), "ended": round(time.time(), 3)}
    if status == "done" and summary_path.is_file():
        early = read_json(summary_path).get("early_stop")
        if early and early.get("stopped_step") is not None:  # train.early_stop ended it: where, and why
            entry["early_stop"] = early
    _restarts_and_ooms(job_dir, record["attempts"], entry)
    record.update(status=status, history=[*record.get("history", []), entry])
    write_json(job_dir / RUN_FILES.job, record)
    if probe_only:
        return err
    err = _failures(job_dir, record["attempts"], entry, err, err_kind, code != 0 and not timed_out)
    write_json(job_dir / RUN_FILES.job, record)
    return err
