"""Run directories written by hand (job.json / eval.json / fleet.json) for leaderboard tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from musubi.store.rundir import write_json


def task_job(run: Path, name: str, task: str = "detection", metrics: dict[str, Any] | None = None,
             fps: float | None = None, status: str = "done", primary: str | None = None) -> Path:
    """A finished task job's folder: job.json, and eval.json when metrics are given."""
    d = run / name
    write_json(d / "job.json", {"config": {"name": name, "task": task, "model": f"{task}-model"}, "status": status})
    if metrics is not None:
        record: dict[str, Any] = {"metrics": metrics, "primary_metric": primary or next(iter(metrics), None)}
        if fps is not None:
            record["fps"] = {"fps": fps, "runtime": "torch-cpu", "device_name": "cpu"}
        write_json(d / "eval.json", record)
    return d


def external_job(run: Path, name: str, record: dict[str, Any] | None) -> Path:
    """An external job's folder: only what the program wrote (eval.json, or nothing)."""
    d = run / name
    d.mkdir(parents=True, exist_ok=True)
    if record is not None:
        write_json(d / "eval.json", record)
    return d
