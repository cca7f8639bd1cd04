"""Calibration figures from a measured Musubi run: `musubi plan --calibrate RUN`.

A job of the run must have JOB/plan.json (written by the runtime when its task can describe
its model to the planner, e.g. the `lm` task): model spec, layout, GPUs, global batch and the
GPU's catalog name. The step time is read from JOB/metrics.jsonl and the all-reduce bus
bandwidth from the preflight report (RUN/preflight.json) when the run had one. Pure file
reading: no torch.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from musubi.contract.run_files import RUN_FILES
from musubi.plan.errors import PlanError

PLAN_FILE = "plan.json"
#: Log records skipped at the start of a run: cudnn autotuning, allocator growth, compilation.
WARMUP_RECORDS = 1


def _job_dir(path: Path) -> Path:
    """The job directory of RUN or RUN/JOB that holds plan.json (exactly one, or the one named)."""
    if not path.is_dir():
        raise PlanError(f"--calibrate {path}: no such file or run directory")
    if (path / PLAN_FILE).is_file():
        return path
    found = sorted(p.parent for p in path.glob(f"*/{PLAN_FILE}"))
    if not found:
        raise PlanError(f"--calibrate {path}: no job of this run has {PLAN_FILE} (the runtime writes it for "
                        "tasks the planner can describe, such as lm); give a calibration JSON file instead")
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise PlanError(f"--calibrate {path}: several jobs have {PLAN_FILE} ({names}); give one: {path}/JOB")
    return found[0]


def measured_step_time(job_dir: Path, global_batch: int) -> tuple[float, int]:
    """(median seconds per optimizer step, log records used) from metrics.jsonl's training records."""
    path = job_dir / RUN_FILES.metrics
    if not path.is_file():
        raise PlanError(f"{job_dir}: no metrics.jsonl (the run logged no training step)")
    rates = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash
        if isinstance(rec, dict) and rec.get("kind") == "train" and isinstance(rec.get("samples_per_s"), (int, float)):
            rates.append(float(rec["samples_per_s"]))
    rates = rates[WARMUP_RECORDS:]
    if not rates or min(rates) <= 0:
        raise PlanError(f"{job_dir}: fewer than {WARMUP_RECORDS + 1} training log records; run more steps "
                        "(train.max_steps) or log more often (train.log_every)")
    return global_batch / statistics.median(rates), len(rates)


def _busbw(run_dir: Path, job_dir: Path) -> dict[str, float]:
    """{'nvlink' or 'pcie': GB/s} from the preflight's NCCL all-reduce, when there is one."""
    for path in (job_dir / RUN_FILES.preflight, run_dir / RUN_FILES.preflight):
        if not path.is_file():
            continue
        try:
            readings = json.loads(path.read_text(encoding="utf-8")).get("readings") or {}
        except ValueError:
            continue
        comm = readings.get("comm") or {}
        if comm.get("backend") != "nccl" or not comm.get("busbw_gbps") or not comm.get("correct"):
            continue
        links = ((readings.get("topology") or {}).get("links") or {}).values()
        tier = "nvlink" if any(str(v).startswith("NV") for v in links) else "pcie"
        return {tier: float(comm["busbw_gbps"])}
    return {}


def calibration_from_run(path: Path) -> dict[str, Any]:
    """The calibration fields (see calibrate.py) one run measured."""
    job_dir = _job_dir(path)
    try:
        plan = json.loads((job_dir / PLAN_FILE).read_text(encoding="utf-8"))
    except ValueError as e:
        raise PlanError(f"{job_dir / PLAN_FILE}: not valid JSON ({e})") from None
    if not plan.get("gpu"):
        raise PlanError(f"{job_dir}: measured on {plan.get('device_name') or 'CPU ranks'}, which the GPU catalog "
                        "lacks; add it to musubi/plan/data/gpus.yaml or calibrate from a GPU run")
    step, used = measured_step_time(job_dir, int(plan["global_batch"]))
    data: dict[str, Any] = {"gpu": plan["gpu"], "step_time_s": step, "model": plan["model"],
                            "layout": plan["layout"], "gpus": plan["gpus"], "nodes": plan.get("nodes", 1),
                            "global_batch": plan["global_batch"]}
    busbw = _busbw(job_dir.parent, job_dir)
    if busbw:
        data["allreduce_busbw_gbps"] = busbw
    data["_source"] = {"job_dir": str(job_dir), "log_records": used}
    return data
