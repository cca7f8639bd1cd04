"""The fleet's leaderboard: every job of a run directory, scored and ranked, written to RUN/leaderboard.json.

Jobs are ranked in one table per quality metric (`table`: map50, top1, ...), each
with its own FPS normalisation and FPS protocol (runtime, device, CPU threads; a
warning where its jobs were timed unlike). Jobs below a quality floor (score.py) are
listed after the ranked ones of their table with `rank: null`, `below_floor: true`
and a `reason`; jobs that cannot be scored (failed, no metrics, no FPS while FPS has
weight) come last, each with its reason. Equal scores share a rank (1, 2, 2, 4),
ties listed by quality then name. No torch.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.evaluate.score import (
    DEFAULT_MIN_QUALITY,
    DEFAULT_QUALITY_FLOOR,
    KNOWN_PRIMARY,
    QUALITY_BY_TASK,
    ScoreRule,
    Unscorable,
    composite,
    fps_base,
    fps_norm,
    fps_value,
    quality_metric,
    quality_value,
)
from musubi.store.rundir import read_json, write_json

log = logging.getLogger("musubi.evaluate")

LEADERBOARD_FILE = RUN_FILES.leaderboard
#: Scores equal to this many decimals are a tie (0.7 x 0.5 + 0.3 x 1.0 must tie 0.65 exactly).
_TIE_DECIMALS = 9
#: Folders a failed attempt is moved to by the fleet (not jobs of their own).
_ATTEMPT_RE = re.compile(r"\.attempt\d+$")


@dataclass
class JobResult:
    """What the leaderboard knows of one job before scoring."""

    job: str
    kind: str  # task | external
    status: str  # done | failed | running | ... | unknown
    task: str | None = None
    model: str | None = None
    record: dict[str, Any] = field(default_factory=dict)  # eval.json ({} when absent)
    problem: str | None = None  # why it cannot be scored even before looking at metrics


def _read(path: Path) -> tuple[Any, str | None]:
    if not path.is_file():
        return None, None
    try:
        return read_json(path), None
    except (OSError, ValueError):
        return None, f"{path.name} is not readable JSON"


def _fleet_states(run_dir: Path) -> dict[str, dict[str, Any]] | None:
    """Job states from RUN/fleet.json (written by `musubi run`), or None for a `musubi train` run."""
    data, _ = _read(run_dir / RUN_FILES.fleet)
    jobs = data.get("jobs") if isinstance(data, dict) else None
    return jobs if isinstance(jobs, dict) else None


def collect_jobs(run_dir: Path) -> list[JobResult]:
    """Every job of a run directory with its status and eval.json."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run directory")
    states = _fleet_states(run_dir)
    if states is not None:
        names = sorted(states)
    else:
        names = sorted(p.name for p in run_dir.iterdir() if p.is_dir() and not _ATTEMPT_RE.search(p.name)
                       and ((p / RUN_FILES.job).is_file() or (p / RUN_FILES.eval).is_file()))
    return [_job_result(run_dir / name, (states or {}).get(name)) for name in names]


def _job_result(job_dir: Path, state: dict[str, Any] | None) -> JobResult:
    job_record, job_problem = _read(job_dir / RUN_FILES.job)
    job_record = job_record if isinstance(job_record, dict) else {}
    config = job_record.get("config") if isinstance(job_record.get("config"), dict) else {}
    kind = "task" if "task" in config else "external"
    status = str((state or {}).get("state") or job_record.get("status") or "unknown")
    record, eval_problem = _read(job_dir / RUN_FILES.eval)
    result = JobResult(job_dir.name, kind, status, config.get("task"), config.get("model"),
                       record if isinstance(record, dict) else {})
    if status == "failed":
        causes = (state or {}).get("causes") or []
        history = job_record.get("history") or [{}]
        why = causes[-1] if causes else history[-1].get("error") if isinstance(history[-1], dict) else None
        result.problem = f"failed: {why}" if why else "failed"
    elif eval_problem or job_problem:
        result.problem = eval_problem or job_problem
    elif not result.record:
        result.problem = f"no eval.json (status {status})"
    return result


def rank_jobs(jobs: list[JobResult], rule: ScoreRule) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Score and rank jobs, one table per quality metric: (rows, header stating the formula, the floors and
    each table's FPS normalisation and protocol)."""
    rows: list[dict[str, Any]] = []
    for j in jobs:
        row: dict[str, Any] = {"rank": None, "job": j.job, "kind": j.kind, "task": j.task, "model": j.model,
                               "status": j.status, "table": None, "metric": None, "quality": None,
                               "fps": fps_value(j.record), "fps_norm": None, "score": None, "reason": j.problem}
        fps = j.record.get("fps")
        if isinstance(fps, dict):
            row["fps_runtime"], row["fps_device"] = fps.get("runtime"), fps.get("device_name") or fps.get("device")
            row["fps_threads"] = fps.get("threads")
        row["metrics"] = j.record.get("metrics") if isinstance(j.record.get("metrics"), dict) else {}
        trained = j.record.get("precision")
        row["precision"] = trained.get("final") if isinstance(trained, dict) else None
        if j.problem is None:
            try:
                row["metric"] = quality_metric(j.task, j.record)
                row["quality"] = quality_value(row["metric"], j.record)
                row["floor"], row["floor_from"] = rule.absolute_floor(row["metric"], j.record)
                if rule.fps_weight > 0 and row["fps"] is None:
                    raise Unscorable(str(j.record.get("fps_missing") or "no FPS measured (run the evaluation step)"))
                row["table"] = row["metric"]  # scored: ranked (or below a floor) in its metric's table
            except Unscorable as e:
                row["reason"] = str(e)
        rows.append(row)
    tables: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["reason"] is None:
            tables.setdefault(r["metric"], []).append(r)
    ordered: list[dict[str, Any]] = []
    described = []
    # Known headline metrics first (mAP50, top-1, ...), then the rest by name.
    for metric in sorted(tables, key=lambda m: (KNOWN_PRIMARY.index(m) if m in KNOWN_PRIMARY else len(KNOWN_PRIMARY),
                                                 m)):
        ranked, below, about = _rank_table(tables[metric], rule)
        ordered += ranked + below
        described.append({"metric": metric, **about})
    unscored = sorted((r for r in rows if r["reason"] is not None and not r.get("below_floor")),
                      key=lambda r: r["job"])
    header: dict[str, Any] = {
        "formula": rule.formula,
        "weights": {"quality": rule.quality_weight, "fps": rule.fps_weight},
        "fps_target": rule.fps_target,
        "fps_base": described[0]["fps_base"] if len(described) == 1 else None,
        "fps_normalisation": described[0]["fps_normalisation"] if len(described) == 1 else
        "per table: " + "; ".join(f"{t['metric']}: {t['fps_normalisation']}" for t in described)
        if described else rule.normalisation(None),
        "quality_floor": {"share": rule.quality_floor, "rule": rule.floor_rule,
                          "min_quality": {**DEFAULT_MIN_QUALITY, **rule.min_quality}},
        "quality_metrics": {**QUALITY_BY_TASK, "other": "the job's primary_metric (a fraction in [0, 1])"},
        "tables": described,
    }
    warnings = [f"{t['metric']} table: {t['warning']}" if len(described) > 1 else t["warning"]
                for t in described if t.get("warning")]
    if warnings:
        header["warning"] = "; ".join(warnings)
    return ordered + unscored, header


def _rank_table(rows: list[dict[str, Any]], rule: ScoreRule) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                     dict[str, Any]]:
    """Rank the scorable rows of one metric: (ranked, below a floor, the table's FPS base, normalisation,
    protocol and warning)."""
    below = _below_floor(rows, rule)
    scorable = [r for r in rows if not r.get("below_floor")]
    with_fps = [r for r in scorable if r["fps"] is not None]
    base = fps_base(rule, [r["fps"] for r in with_fps])
    best = max(with_fps, key=lambda r: r["fps"])["job"] if with_fps and rule.fps_target is None else None
    for r in scorable:
        if r["fps"] is not None and base is not None:
            r["fps_norm"] = fps_norm(rule, r["fps"], base)
        r["score"] = composite(rule, r["quality"], r["fps_norm"])
    scorable.sort(key=lambda r: (-round(r["score"], _TIE_DECIMALS), -r["quality"], r["job"]))
    previous: tuple[float, int] | None = None
    for position, r in enumerate(scorable, start=1):
        key = round(r["score"], _TIE_DECIMALS)
        r["rank"] = previous[1] if previous is not None and previous[0] == key else position
        previous = (key, r["rank"])
    below.sort(key=lambda r: (-r["quality"], r["job"]))
    about: dict[str, Any] = {"jobs": len(rows), "ranked": len(scorable), "fps_base": base,
                             "fps_normalisation": rule.normalisation(base, best)}
    timed = [r for r in scorable if r["fps"] is not None]
    protocols = sorted({fps_protocol(r) for r in timed})
    about["fps_protocol"] = protocols[0] if len(protocols) == 1 else None
    runtimes = sorted({str(r.get("fps_runtime")) for r in timed})
    if rule.fps_weight > 0 and len(runtimes) > 1:
        about["warning"] = f"FPS measured with different runtimes ({', '.join(runtimes)}): the FPS term compares " \
                           "unlike figures"
    elif rule.fps_weight > 0 and len(protocols) > 1:
        about["warning"] = f"FPS timed on different devices or CPU thread counts ({' | '.join(protocols)}): the " \
                           "FPS term compares unlike figures; evaluate them again on one device"
    return scorable, below, about


def fps_protocol(row: dict[str, Any]) -> str:
    """How a row's FPS was timed, in words: runtime, device and (on a CPU) the threads."""
    threads = row.get("fps_threads")
    cpu = str(row.get("fps_runtime") or "").endswith("cpu")
    return (f"{row.get('fps_runtime') or 'unknown runtime'} on {row.get('fps_device') or 'an unstated device'}"
            + (f", {threads} CPU thread{'s' if threads != 1 else ''}" if cpu and threads else
               ", CPU threads not stated" if cpu else ""))


def _below_floor(rows: list[dict[str, Any]], rule: ScoreRule) -> list[dict[str, Any]]:
    """Mark (reason, below_floor) and return the rows of one metric whose quality is 0, under the metric's
    absolute floor or under the relative floor: listed, never ranked, so no speed makes up for a model that
    does not do the job."""
    if not rows:
        return []
    top = max(rows, key=lambda r: r["quality"])
    floor = rule.floor(top["quality"])
    below = []
    for r in rows:
        if r["quality"] <= 0:
            r["reason"] = f"{r['metric']} is 0: not ranked, whatever its speed"
        elif r["quality"] < r["floor"]:
            r["reason"] = (f"below the absolute floor: {r['metric']} {r['quality']:.4g} < {r['floor']:.4g} "
                           f"({r['floor_from']}): not ranked, whatever its speed")
        elif r["quality"] < floor:
            r["reason"] = (f"below the quality floor: {r['metric']} {r['quality']:.4g} < {rule.quality_floor:g} x "
                           f"{top['quality']:.4g} (best, {top['job']})")
        else:
            continue
        r["below_floor"] = True
        below.append(r)
    return below


def build_leaderboard(run_dir: Path, weights: tuple[float, float] = (0.7, 0.3), fps_target: float | None = None,
                      history: bool = True, quality_floor: float = DEFAULT_QUALITY_FLOOR,
                      min_quality: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Rank a run's jobs, write RUN/leaderboard.json (and the store's history); return the rows."""
    run_dir = Path(run_dir)
    if len(weights) != 2:
        raise ConfigError(f"leaderboard: weights {weights!r}: give two numbers (quality, fps)")
    rule = ScoreRule(float(weights[0]), float(weights[1]), fps_target, quality_floor, dict(min_quality or {}))
    rows, header = rank_jobs(collect_jobs(run_dir), rule)
    header["created"] = dt.datetime.now(dt.timezone.utc).isoformat()
    write_json(run_dir / LEADERBOARD_FILE, {**header, "rows": rows})
    if history:
        from musubi.evaluate.registry import record_leaderboard

        try:
            record_leaderboard(run_dir, rows)
        except (ConfigError, OSError, sqlite3.Error) as e:  # the file is the result; history a convenience
            log.warning("leaderboard history not recorded: %s", e)
    return rows


def nothing_to_ship(job_dir: Path, kind: str | None) -> bool:
    """An external job that left no model.onnx: Musubi has no model of it to export or register (not a failure:
    the fleet ships the next model of its table, and a fleet of such jobs ships nothing)."""
    return kind == "external" and not (Path(job_dir) / RUN_FILES.onnx).is_file()


def external_model(job_dir: Path) -> str:
    """What an external job's model.onnx is, in words: its program's own file, or the ONNX Musubi had its framework
    export from the weights it recorded (eval.json's "model_export", evaluate/framework_export.py)."""
    made, _ = _read(Path(job_dir) / RUN_FILES.eval)
    made = made.get("model_export") if isinstance(made, dict) else None
    if not isinstance(made, dict):
        return "its own model.onnx"
    weights = Path(str(made.get("weights") or "best.pt")).name
    return (f"the ONNX export of its {weights} ({made.get('framework')}'s exporter in the job's Python"
            + (", NMS included)" if made.get("nms") else ")"))


def read_leaderboard(run_dir: Path) -> dict[str, Any]:
    """RUN/leaderboard.json as written by build_leaderboard (ConfigError if absent or unreadable)."""
    path = Path(run_dir) / LEADERBOARD_FILE
    data, problem = _read(path)
    if problem or not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ConfigError(f"{path}: missing or unreadable; run `musubi leaderboard {run_dir}` to build it")
    return data
