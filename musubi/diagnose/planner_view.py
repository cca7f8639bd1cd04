"""The planner's prediction for a job (JOB/plan.json) beside what the job measured: for the page and --json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NO_PLAN = ("no planner prediction: the job has no plan.json (its task has no plan_spec, e.g. the vision "
           "tasks; the planner describes LM jobs)")
MFU_NOTE = ("achieved MFU is the planner's FLOPs per step divided by the measured step time (predicted MFU x "
            "predicted step time / measured step time), not a hardware counter")


def planner_view(job_dir: Path) -> dict[str, Any]:
    """{predicted, measured, layout, gpu, notes}, or {note} when the job has no prediction."""
    from musubi.records.evidence import median_rate, train_records

    try:
        plan = json.loads((job_dir / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"note": NO_PLAN}
    pred = plan.get("predicted") if isinstance(plan, dict) else None
    if not isinstance(pred, dict):
        return {"note": NO_PLAN}
    records = train_records(job_dir)
    rate = median_rate(records)
    step = plan["global_batch"] / rate if rate and plan.get("global_batch") else None
    peaks = [r["mem_peak_allocated_gib"] for r in records if isinstance(r.get("mem_peak_allocated_gib"), (int, float))]
    predicted: dict[str, Any] = {}
    measured: dict[str, Any] = {}
    if pred.get("step_time_s") is not None:
        predicted["step_time_s"] = pred["step_time_s"]
        measured["step_time_s"] = round(step, 6) if step else None
    mem_pred = (pred.get("memory_gib") or {}).get("allocated")
    if mem_pred is not None:
        predicted["memory_allocated_gib"] = mem_pred
        measured["memory_allocated_gib"] = max(peaks) if peaks else None
    if pred.get("mfu") is not None:
        predicted["mfu"] = pred["mfu"]
        achieved = pred["mfu"] * pred["step_time_s"] / step if step and pred.get("step_time_s") else None
        measured["mfu_achieved"] = round(achieved, 4) if achieved else None
    return {"predicted": predicted, "measured": measured, "layout": plan.get("layout"), "gpu": plan.get("gpu"),
            "notes": [MFU_NOTE] if "mfu" in predicted else []}
