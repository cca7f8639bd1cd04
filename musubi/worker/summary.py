"""What rank 0 writes when training ends: summary.json (the run's figures) and eval.json (its validation)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from musubi.config.batch_plan import BatchPlan
from musubi.contract.run_files import RUN_FILES
from musubi.tasks.base import Task
from musubi.tasks.data_line import data_record

log = logging.getLogger("musubi.worker")


def write_summary(job_dir: Path, summary: dict[str, Any], plan: BatchPlan, restarts: int, trainer: Any,
                  task: Task, workers_from: str) -> None:
    """Rank 0: summary.json (the trainer's summary, the batch and the loader it ran with), and eval.json."""
    summary["batch_source"] = plan.source
    summary["per_rank_batch"] = plan.per_rank
    summary["accumulation"] = plan.accumulation
    summary["restarts"] = restarts
    summary["data"] = data_record(task.spec, getattr(trainer.feed, "dataset_size", None),
                                  getattr(trainer.val, "size", None))
    loader = getattr(getattr(trainer, "feed", None), "plan", None)
    if loader is not None:  # on-device synthetic data has no loader
        measured = getattr(trainer.feed, "measured", None)
        if measured:
            workers_from = "measured (samples/s: " + ", ".join(
                f"{k} workers {r:.0f}" for k, r in measured.items()) + ")"
        summary["loader"] = {**loader.record(), "workers_from": workers_from, **task.feed_counts(),
                             "times": trainer.feed.times()}
    (job_dir / RUN_FILES.summary).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    if summary["val"]:
        (job_dir / RUN_FILES.eval).write_text(
            json.dumps({"metrics": summary["val"], "step": summary["steps"],
                        "primary_metric": task.primary_metric, "classes": task.class_names(),
                        "how": "validation split, each sample counted once over all ranks"
                        + merge_how(task), **task.eval_notes(trainer.model)}, indent=1),
            encoding="utf-8")
    log.info("done: %d/%d steps, %.1fs", summary["steps"], summary["total_steps"], summary["train_s"])


def merge_how(task: Any) -> str:
    """How sliced evaluation merged tile detections (eval.json's "how"), or ""."""
    data = getattr(getattr(task, "spec", None), "data", None)
    sl = getattr(data, "slice", None)
    if sl is None or not getattr(sl, "sliced_eval", False) or getattr(data, "synthetic", None) is not None:
        return ""
    return (f"; whole frames predicted on {sl.tile} px tiles (overlap {sl.overlap:g}), merged by {sl.merge}"
            f"{f' ({sl.match_metric})' if sl.merge == 'nmm' else ''} at {sl.nms_iou:g}")
