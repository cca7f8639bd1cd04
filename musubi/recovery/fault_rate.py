"""A job's own fault rate, from its attempts' progress files: the M of the checkpoint cadence (plan/cadence.py).

Rank 0 of every attempt writes `progress/a{launch}.{restart}.jsonl` (recovery/goodput.py): a `start` line first,
a line per optimizer step, and `end` only when training finished. An attempt whose file has no `end` was ended by
a fault (a killed or hung rank, a crash, an OOM or non-finite loss that restarted every rank, a preemption): each
cost the steps since the last checkpoint. Only the first and last lines are read: a long attempt's file is large.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musubi.config.job import CheckpointSpec
from musubi.contract.run_files import RUN_FILES
from musubi.plan.cadence import FIRST_GUESS, job_mtbf, prior_mtbf, rule_line

#: Bytes read from a progress file's end for its last line (a line is under 100 bytes).
TAIL_BYTES = 4096


@dataclass(frozen=True)
class FaultHistory:
    """What the job's attempts so far say about its faults."""

    exposure_s: float  # seconds the attempts ran (first line to last), the current attempt's excluded
    faults: int  # attempts that ended without finishing
    attempts: int  # attempts counted (the current one excluded)
    current_start: float | None  # wall-clock start of the current attempt (its `start` line), if found


def _edge_lines(path: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The first and the last whole JSON line of a progress file; None for an empty or unreadable one."""
    try:
        with open(path, "rb") as f:
            first_raw = f.readline()
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read().splitlines()
        first = json.loads(first_raw)
    except (OSError, ValueError):
        return None
    for raw in reversed(tail):  # a line cut by a SIGKILL mid-write is skipped
        try:
            return first, json.loads(raw)
        except ValueError:
            continue
    return first, first


def fault_history(job_dir: Path, current: str | None = None) -> FaultHistory:
    """Exposure and faults over the job's attempts; `current` (launch.restart) is the attempt still running."""
    d = job_dir / RUN_FILES.progress
    exposure, faults, attempts, current_start = 0.0, 0, 0, None
    for p in sorted(d.glob("a*.jsonl")) if d.is_dir() else []:
        edges = _edge_lines(p)
        if edges is None:
            continue
        first, last = edges
        try:
            t0, t1 = float(first["t"]), float(last["t"])
        except (KeyError, TypeError, ValueError):
            continue
        if p.stem.removeprefix("a") == current:
            current_start = t0
            continue
        attempts += 1
        exposure += max(0.0, t1 - t0)
        faults += last.get("event") != "end"
    return FaultHistory(round(exposure, 3), faults, attempts, current_start)


def cadence_plan(spec: CheckpointSpec, ranks: int, job_dir: Path | None) -> dict[str, Any]:
    """The checkpoint cadence a job will follow and its inputs, for the dry run and plan.json.

    `job_dir`: the job's folder when it exists (a resume, a restart): its history gives M.
    """
    every = spec.every_steps
    if not spec.enabled:
        return {"every_steps": None, "rule": "checkpoints off (checkpoint.enabled: false)"}
    if every != "auto":
        return {"every_steps": every, "rule": f"every {every} steps" if every else "at the end of each epoch"}
    h = fault_history(job_dir) if job_dir is not None and job_dir.is_dir() else FaultHistory(0.0, 0, 0, None)
    prior = spec.mtbf_s or prior_mtbf(ranks)
    mtbf, mtbf_from = job_mtbf(prior, h.exposure_s, h.faults)
    if mtbf_from == "prior" and spec.mtbf_s:
        mtbf_from = "checkpoint.mtbf_s"
    return {"every_steps": "auto", "rule": rule_line(mtbf, mtbf_from, ranks, spec.max_interval_s, FIRST_GUESS),
            "mtbf_s": round(mtbf, 1), "mtbf_from": mtbf_from, "prior_mtbf_s": round(prior, 1),
            "faults": h.faults, "exposure_s": h.exposure_s, "max_interval_s": spec.max_interval_s,
            "first_guess": FIRST_GUESS, "decisions": RUN_FILES.cadence}
