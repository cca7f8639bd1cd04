"""Memory as a resource: OOM detection, memory figures, and recovery by coordinated restart.

Why a restart and not an in-process retry: an OOM on one rank in backward leaves
its peers inside DDP's gradient all-reduce, waiting for buckets the failed rank
will never send. No rank can leave that collective on its own, so recovery must
involve every rank. Musubi turns the OOM into a coordinated restart: the failed
rank records what happened (`JOB/memory/oom-*.json`) and exits with
`EXIT_OOM` (contract/exits.py); torchrun (`--max-restarts`) stops the others and restarts all
ranks; at start every rank reads the same records, applies the job's OOM policy
(all ranks compute the same smaller batch, then agree on the minimum by an
all-reduce), and resumes from the newest committed checkpoint. The failed step
is redone, no batch is lost or counted twice, and under `keep_global_batch` the
optimizer sees the same global batch and LR as before.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from musubi.config.batch_plan import scale_lr
from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.contract.records import OomRecord
from musubi.contract.run_files import RUN_FILES

log = logging.getLogger("musubi.memory")

GIB = 2**30
#: The end of an OOM recovery's log line: the smaller batch is not given back (see shrink_after_oom).
KEPT = "kept for the rest of this job (memory/batch.json)"


def is_oom(exc: BaseException) -> bool:
    """True for CUDA OOM errors and for the CPU allocator's 'can't allocate memory'."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exc, oom_type):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "can't allocate memory" in text)


def memory_figures(device: torch.device) -> dict[str, float]:
    """Allocated/reserved/peak (GiB), allocator retries and fragmentation of this rank's GPU."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    alloc = stats.get("allocated_bytes.all.current", 0)
    reserved = stats.get("reserved_bytes.all.current", 0)
    return {
        "mem_allocated_gib": round(alloc / GIB, 3),
        "mem_reserved_gib": round(reserved / GIB, 3),
        "mem_peak_allocated_gib": round(stats.get("allocated_bytes.all.peak", 0) / GIB, 3),
        "mem_peak_reserved_gib": round(stats.get("reserved_bytes.all.peak", 0) / GIB, 3),
        "mem_fragmentation_gib": round((reserved - alloc) / GIB, 3),
        "mem_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "mem_total_gib": round(total / GIB, 3),
        "mem_free_gib": round(free / GIB, 3),
    }


def memory_dir(job_dir: Path) -> Path:
    """Where OOM records, the effective batch and probe results live."""
    return job_dir / RUN_FILES.memory


def record_oom(job_dir: Path, rank: int, step: int, phase: str, per_rank: int, accumulation: int,
               device: torch.device, error: str, steps_done: int = 1) -> Path:
    """Write this rank's OOM record (read by every rank after the restart).

    `steps_done`: optimizer steps this attempt completed before the OOM (0: the
    batch never fit, so the restart probes instead of halving once).
    """
    d = memory_dir(job_dir)
    d.mkdir(parents=True, exist_ok=True)
    rec = OomRecord(rank=rank, step=step, phase=phase, per_rank=per_rank, accumulation=accumulation,
                    steps_done=steps_done, time=time.time(), error=error[:300], **memory_figures(device))
    path = d / f"oom-{int(time.time() * 1000)}-rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1), encoding="utf-8")
    os.replace(tmp, path)
    return path


def pending_ooms(job_dir: Path) -> list[dict[str, Any]]:
    """OOM records not yet applied, oldest first."""
    d = memory_dir(job_dir)
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("oom-*.json")):
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except ValueError:
            continue
        rec["_path"] = str(p)
        out.append(rec)
    return out


def mark_applied(records: list[dict[str, Any]]) -> None:
    """Rename applied records (kept for the post-mortem, never applied twice)."""
    for rec in records:
        p = Path(rec["_path"])
        if p.exists():
            p.rename(p.with_name("applied-" + p.name))


def effective_batch_path(job_dir: Path) -> Path:
    """The batch in force after probes and recoveries (JSON: per_rank, accumulation, global, lr)."""
    return memory_dir(job_dir) / "batch.json"


def read_effective_batch(job_dir: Path) -> dict[str, Any] | None:
    """The batch in force from an earlier attempt of this job, if any."""
    p = effective_batch_path(job_dir)
    try:
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None
    except ValueError:
        return None


def shrink_after_oom(spec: JobSpec, per_rank: int, accumulation: int, world: int, oom: dict[str, Any]
                     ) -> tuple[int, int, str]:
    """(per_rank, accumulation, reason) after one OOM under the job's policy; ConfigError at the floor.

    The LR is not decided here: it always follows the resulting global batch by the job's rule. The smaller batch
    is kept for the rest of the job (memory/batch.json; docs/guides/memory.md says why): a real OOM comes back at
    the batch that caused it, and each return costs a restart.
    """
    t = spec.train
    new_batch = per_rank // 2
    if new_batch < t.min_batch:
        figures = ""
        if "mem_total_gib" in oom:
            figures = (f" ({oom.get('mem_peak_allocated_gib')} GiB peak allocated of "
                       f"{oom.get('mem_total_gib')} GiB)")
        raise ConfigError(
            f"out of memory: {spec.model_label()} at per-rank batch {per_rank} on rank {oom['rank']} in "
            f"{oom['phase']} (step {oom['step']}){figures}; halving would go below train.min_batch="
            f"{t.min_batch}: use strategy fsdp, a smaller input or model, or lower train.min_batch"
        )
    if t.oom_policy == "keep_global_batch":
        new_acc = accumulation * (per_rank // new_batch) if per_rank % new_batch == 0 else accumulation * 2
        reason = (f"OOM on rank {oom['rank']} in {oom['phase']} at step {oom['step']}: per-rank batch "
                  f"{per_rank} -> {new_batch}, accumulation {accumulation} -> {new_acc}, global batch and LR "
                  f"unchanged, {KEPT}")
        return new_batch, new_acc, reason
    g = new_batch * world * accumulation
    lr = scale_lr(t.lr, g, t.base_batch, t.lr_rule)
    reason = (f"OOM on rank {oom['rank']} in {oom['phase']} at step {oom['step']}: per-rank batch {per_rank} -> "
              f"{new_batch}, global batch {per_rank * world * accumulation} -> {g}, lr {lr:.4g} ({t.lr_rule} rule), "
              f"{KEPT}")
    return new_batch, accumulation, reason
