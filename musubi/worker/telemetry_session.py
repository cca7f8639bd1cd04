"""Start a rank's telemetry: span recorder, comm hook, hardware sampler and (rank 0) straggler watch."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from musubi.config.job import JobSpec
from musubi.contract.run_files import RUN_FILES
from musubi.contract.world import World
from musubi.telemetry.comm_hook import attach
from musubi.telemetry.sampler import Sampler, open_nvml_device
from musubi.telemetry.spans import SpanRecorder

log = logging.getLogger("musubi.telemetry")


def telemetry_dir(job_dir: Path) -> Path:
    """JOB/telemetry/."""
    return job_dir / RUN_FILES.telemetry


def open_telemetry(spec: JobSpec, world: World, job_dir: Path, model: torch.nn.Module,
                   feed: Any = None, reduce: Any = None) -> SpanRecorder:
    """The recorder the loop marks sections on; its companions stop with `recorder.close()`.

    `reduce`: the gradient all-reduce the DDP timing hook wraps (None: DDP's own)."""
    cfg = spec.telemetry
    d = telemetry_dir(job_dir)
    d.mkdir(parents=True, exist_ok=True)
    rec = SpanRecorder(d / f"rank{world.rank}.jsonl", world.rank, world.device, enabled=cfg.enabled)
    if not cfg.enabled:
        return rec
    attach(model, rec, reduce)
    if feed is not None:
        feed.section = rec.section
    nvml = open_nvml_device(world.device.index if world.is_cuda else None)
    rec.companions.append(Sampler(d / f"sampler-rank{world.rank}.jsonl", world.rank, cfg.sample_hz, nvml,
                                  worker_pids=getattr(feed, "worker_pids", None)))
    if world.is_main and world.size > 1:
        from musubi.telemetry.straggler import default_threshold
        from musubi.telemetry.watch import StragglerWatch

        rec.companions.append(StragglerWatch(d, world.size, default_threshold(cfg.straggler_threshold,
                                                                              world.is_cuda)))
    return rec
