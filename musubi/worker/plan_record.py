"""JOB/plan.json: the job as the planner sees it, and what the planner predicts for it.

Written by rank 0 once the batch is decided. It is what makes a run usable by the planner
later without torch: `musubi plan --calibrate RUN` fits the planner's constants from it and
the measured figures, and reports can set predicted beside measured (memory, step time, MFU).
Jobs whose task cannot describe its model to the planner (`Task.plan_spec() is None`) get none.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from musubi.config.batch_plan import BatchPlan
from musubi.config.job import JobSpec
from musubi.contract.world import World
from musubi.plan.catalog import gpu_for_device
from musubi.plan.cluster import make_cluster
from musubi.plan.errors import PlanError
from musubi.plan.layout import parse_layout
from musubi.plan.memory import estimate_memory
from musubi.plan.predict import predict
from musubi.recovery.fault_rate import cadence_plan
from musubi.store.rundir import write_json
from musubi.tasks.base import Task

log = logging.getLogger("musubi")

PLAN_FILE = "plan.json"


def plan_record(spec: JobSpec, model: Any, world_size: int, plan: BatchPlan, precision: str,
                device_name: str | None) -> dict[str, Any]:
    """The record for one job: model spec, layout, batch, the GPU's catalog name and the predictions."""
    zero = 3 if spec.train.strategy == "fsdp" else 0
    # PyTorch FSDP2 gathers one flat buffer per wrapped block (gather=node): its memory holds whole blocks
    layout = f"dp={world_size},zero={zero},micro={plan.per_rank}" + (",gather=node" if zero == 3 else "")
    # PyTorch autocast keeps fp32 weights and gradients; AdamW adds two fp32 moments, SGD one.
    memory_precision = "amp" if spec.train.optimizer == "adamw" else "amp-sgd"
    gpu = gpu_for_device(device_name) if device_name else None
    record: dict[str, Any] = {
        "model": {k: v for k, v in asdict(model).items()}, "layout": layout, "gpus": world_size, "nodes": 1,
        "global_batch": plan.global_batch, "accumulation": plan.accumulation, "precision": precision,
        "memory_precision": memory_precision, "device_name": device_name, "gpu": gpu.name if gpu else None,
        "predicted": None,
    }
    if precision not in ("bf16", "fp16"):
        record["why_no_prediction"] = f"precision {precision}: the planner models mixed precision only"
        return record
    lay = parse_layout(layout)
    try:
        memory = estimate_memory(model, lay, plan.global_batch, memory_precision)
        predicted: dict[str, Any] = {"memory_gib": memory.as_dict()}
        if gpu is not None:
            pred = predict(model, make_cluster(gpu, world_size, 1), lay, plan.global_batch, precision="bf16",
                           memory_precision=memory_precision)
            predicted.update(step_time_s=pred.step_time_s, mfu=pred.mfu, tokens_per_s=pred.tokens_per_s,
                             comm_s=pred.comm_s, exposed_comm_s=pred.exposed_comm_s)
        record["predicted"] = predicted
    except PlanError as e:  # a layout the planner refuses is a finding for the record, not a crash
        record["why_no_prediction"] = str(e)
    return record


def write_plan_record(job_dir: Path, spec: JobSpec, task: Task, world: World, plan: BatchPlan,
                      precision: str) -> None:
    """Rank 0: write JOB/plan.json when the task can describe its model (no-op otherwise)."""
    if not world.is_main:
        return
    model = task.plan_spec()
    if model is None:
        return
    name = torch.cuda.get_device_name(world.device) if world.device.type == "cuda" else None
    record = plan_record(spec, model, world.size, plan, precision, name)
    # The checkpoint cadence and its inputs (the prior or this job's fault history); the choices: JOB/cadence.jsonl.
    record["checkpoint_cadence"] = cadence_plan(spec.checkpoint, world.size, job_dir)
    write_json(job_dir / PLAN_FILE, record)
    pred = record.get("predicted") or {}
    if "memory_gib" in pred:
        log.info("planner: %.2f GiB allocated per GPU predicted (%s)%s", pred["memory_gib"]["allocated"],
                 record["layout"], f", step {pred['step_time_s'] * 1e3:.1f} ms" if "step_time_s" in pred else "")
