"""The batch a job trains with: configured, probed (`batch: auto`), or shrunk after an OOM.

Every rank runs the same decision on the same inputs and the ranks confirm it
with collectives, so no rank ever trains with a batch its peers do not know.
The LR always follows the global batch actually used, by the job's LR rule.
"""

from __future__ import annotations

import json
import logging
import platform
from pathlib import Path
from typing import Any

import torch

from musubi.config.batch_plan import BatchPlan, plan_batch, plan_for
from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.contract.inject import Injector
from musubi.contract.world import World
from musubi.recovery import memory
from musubi.store import db
from musubi.store.rundir import write_json

log = logging.getLogger("musubi.batching")


def probe_cache_key(spec: JobSpec, world: World, precision: str) -> dict[str, Any]:
    """What decides the largest batch: model, input, precision, strategy, GPU model, torch version."""
    syn = spec.data.synthetic
    shape: dict[str, Any] = {"image_size": spec.data.image_size, "seq_len": spec.data.seq_len}
    if syn is not None:
        shape.update(image_size=spec.data.image_size or syn.image_size, seq_len=syn.seq_len, vocab=syn.vocab,
                     objects=syn.objects, num_classes=syn.num_classes)
    gpu = torch.cuda.get_device_name(world.device) if world.is_cuda else f"cpu:{platform.machine()}"
    return {"task": spec.task, "model": spec.model, "model_args": spec.model_args, "input": shape,
            "precision": precision, "strategy": spec.train.strategy, "channels_last": spec.train.channels_last,
            "optimizer": spec.train.optimizer, "headroom": spec.train.headroom, "gpu": gpu,
            "torch": torch.__version__}


def _probe(spec: JobSpec, task: Any, world: World, precision: str, injector: Injector, job_dir: Path,
           optimizer_factory: Any, use_cache: bool) -> BatchPlan:
    """`batch: auto`: the cached result, or a probe on every rank (agreed by all-reduce MIN)."""
    from musubi.worker.autobatch import probe_batch

    key = db.cache_key(probe_cache_key(spec, world, precision))
    path = db.db_path(job_dir.parent)
    cached = db.lookup_batch(path, key) if (world.is_main and use_cache) else None
    # Rank 0 reads the cache; the others learn its answer (-1: none) from a collective.
    hit = world.all_reduce_max(cached[0] if cached else -1)
    if hit > 0:
        log.info("batch: auto -> %d per rank (cached in %s; delete the entry to probe again)", hit, path)
        return plan_for(spec, hit, spec.train.accumulation, world.size, "cache")
    syn = spec.data.synthetic
    size = syn.train_size if syn is not None else len(task.train_dataset())
    cap = max(1, size // world.size)
    result = probe_batch(task, world, precision, optimizer_factory, spec.train.headroom, injector, cap,
                         nhwc=spec.train.channels_last)
    if world.is_main:
        detail = result.to_json()
        write_json(memory.memory_dir(job_dir) / "probe.json", {**detail, "key": json.loads(key)})
        if use_cache:
            db.store_batch(path, key, result.batch, {k: detail[k] for k in ("peak_gib", "total_gib", "seconds")})
    log.info("batch: auto -> %d per rank (this rank fits %d; peak %s GiB of %s GiB; %d trials in %.1fs)",
             result.batch, result.local_batch, result.peak_gib, result.total_gib, len(result.trials),
             result.seconds)
    return plan_for(spec, result.batch, spec.train.accumulation, world.size, "probe")


def _jump_after_probe(spec: JobSpec, task: Any, world: World, precision: str, injector: Injector,
                      optimizer_factory: Any, per_rank: int, acc: int, rec: dict[str, Any]) -> tuple[int, int, str]:
    """After an OOM on the first step: the largest per_rank / 2^k that the probe says fits."""
    from musubi.worker.autobatch import probe_batch

    result = probe_batch(task, world, precision, optimizer_factory, spec.train.headroom, injector,
                         cap=per_rank // 2, nhwc=spec.train.channels_last)
    factor = 2
    while per_rank // factor > result.batch and per_rank // factor >= 1:
        factor *= 2
    new = per_rank // factor
    if new < spec.train.min_batch:
        # the floor error of the halving rule, with its figures
        memory.shrink_after_oom(spec, spec.train.min_batch, acc, world.size, rec)
    keep = spec.train.oom_policy == "keep_global_batch"
    new_acc = acc * factor if keep else acc
    after = "global batch and LR unchanged" if keep else f"global batch {per_rank * world.size * acc} -> " \
        f"{new * world.size * acc}"
    reason = (f"OOM on rank {rec['rank']} in {rec['phase']} at step {rec['step']}, before any step fit: probed "
              f"{result.batch} per rank in {result.seconds:.1f}s; per-rank batch {per_rank} -> {new}, accumulation "
              f"{acc} -> {new_acc}, {after}, {memory.KEPT}")
    return new, new_acc, reason


def decide_batch(spec: JobSpec, task: Any, world: World, job_dir: Path, precision: str, injector: Injector,
                 optimizer_factory: Any) -> tuple[BatchPlan, list[str]]:
    """The plan in force now, and the recoveries applied at this start (reasons, for the log)."""
    earlier = memory.read_effective_batch(job_dir)
    if earlier is not None:
        plan = plan_for(spec, int(earlier["per_rank"]), int(earlier["accumulation"]), world.size, "earlier attempt")
        if int(earlier.get("world", world.size)) != world.size:
            raise ConfigError(f"{memory.effective_batch_path(job_dir)}: decided for {earlier.get('world')} ranks, "
                              f"this run has {world.size}; use --nproc {earlier.get('world')}")
        history = list(earlier.get("history", []))
    elif spec.train.batch == "auto":
        # A simulated memory limit (fault injection) must neither use nor pollute the cache.
        plan = _probe(spec, task, world, precision, injector, job_dir, optimizer_factory,
                      use_cache=injector.batch_limit() is None)
        history = [f"batch: auto probed/cached {plan.per_rank} per rank ({plan.source})"]
    else:
        plan = plan_batch(spec, world.size)
        history = []
    records = memory.pending_ooms(job_dir)
    # Every rank must apply the same records: agree on how many were visible to all.
    n = world.all_reduce_min(len(records))
    records = records[:n]
    applied: list[str] = []
    per_rank, acc = plan.per_rank, plan.accumulation
    for rec in records:
        if int(rec["per_rank"]) != per_rank:  # several ranks failing at once is one event
            continue
        if int(rec.get("steps_done", 1)) == 0 and per_rank >= 4 * spec.train.min_batch:
            # Not one step fit at this batch: halving one restart at a time could take many
            # restarts. Probe below it once (every rank, agreed), then jump there.
            per_rank, acc, reason = _jump_after_probe(spec, task, world, precision, injector, optimizer_factory,
                                                      per_rank, acc, rec)
        else:
            per_rank, acc, reason = memory.shrink_after_oom(spec, per_rank, acc, world.size, rec)
        applied.append(reason)
        log.warning("%s", reason)
    if applied:  # keep_global_batch leaves the global batch, hence the LR, as it was
        plan = plan_for(spec, per_rank, acc, world.size, "oom-recovery")
    changed = bool(applied) or earlier is None and plan.source in ("probe", "cache")
    world.barrier()
    if world.is_main:
        if changed:
            write_json(memory.effective_batch_path(job_dir), {
                "per_rank": plan.per_rank, "accumulation": plan.accumulation, "world": world.size,
                "global_batch": plan.global_batch, "lr": plan.lr, "history": history + applied})
        memory.mark_applied(records)
    world.barrier()
    return plan, applied
