"""Checkpoints with torch.distributed.checkpoint, committed atomically.

Layout of one checkpoint: `checkpoints/step-000000123/` holds the DCP shards
(`*.distcp` and `.metadata`), `state.json` (trainer state shared by all ranks:
step, epoch, data position, scheduler and scaler) and, written last by rank 0
once every rank's shards are durable, `COMMITTED`: a JSON marker that lists
every file with its size and SHA-256. A directory without a valid marker, with
a missing or resized file, or (checked before a resume) a file whose checksum
differs, is never loaded: the previous good one is used, with a one-line
warning naming the one skipped.

Writing is done by `saver.py` (synchronous or asynchronous); this module owns
the format: directory names, the marker, verification, retention and loading.

Per-rank state (RNG streams) is stored under rank-specific keys (`rank3/...`)
in the same DCP checkpoint, as tensors; every load goes through `safe_dcp`, so
nothing beyond tensors, containers and DCP's own metadata classes is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

# The torch-free part (marker, verification) lives in committed.py; its names are re-exported for importers.
from musubi.checkpoint.committed import CHECKPOINT_DIR, Committed, by_score, listing, sha256, step_dir
from musubi.checkpoint.committed import MARKER as MARKER
from musubi.checkpoint.committed import STATE_FILE as STATE_FILE
from musubi.checkpoint.committed import best_checkpoint as best_checkpoint
from musubi.checkpoint.committed import committed_checkpoints as committed_checkpoints
from musubi.checkpoint.committed import latest_checkpoint as latest_checkpoint
from musubi.checkpoint.committed import verify as verify
from musubi.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner, describe_failure, full_state
from musubi.contract.errors import ConfigError
from musubi.contract.world import World

log = logging.getLogger("musubi.checkpoint")



def model_signature(model: nn.Module) -> str:
    """A short hash of parameter/buffer names and shapes (to refuse another model's checkpoint)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)};".encode())
    return h.hexdigest()[:16]


def _fsync_write(path: Path, text: str) -> None:
    """Write a file durably and atomically: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _rank_key(rank: int) -> str:
    return f"rank{rank}"


def prepare_dir(root: Path, step: int, world: World) -> Path:
    """Collective: rank 0 clears a leftover of an unfinished save of this step; all wait for it."""
    d = step_dir(root, step)
    if world.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if d.exists():
            # A leftover of a save that died (or the same step saved again after a restart): replace it.
            shutil.rmtree(d)
    world.barrier()
    return d


def agree_buffers(model: nn.Module, world: World) -> None:
    """Collective: every rank takes rank 0's buffers (BatchNorm running statistics and counters).

    Between steps each rank holds the running statistics of its own last batch: DDP broadcasts
    rank 0's only at the start of its next forward, and FSDP2 never does. A checkpoint stores one
    copy of a replicated tensor (DCP's planner picks the rank), and evaluation calls the inner
    module on every rank; both must use the buffers the next step would use, rank 0's. Under DDP
    this changes nothing that training reads (its next forward broadcasts the same values).
    """
    if world.size == 1 or not dist.is_initialized():
        return
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for b in model.buffers():  # a DDP wrapper lists its module's buffers too
        if b.numel():
            groups.setdefault((b.dtype, b.device), []).append(b)
    with torch.no_grad():
        for bufs in groups.values():  # one broadcast per dtype and device, not one per buffer
            flat = torch.cat([b.reshape(-1) for b in bufs])
            dist.broadcast(flat, src=0)
            offset = 0
            for b in bufs:
                b.copy_(flat[offset:offset + b.numel()].view_as(b))
                offset += b.numel()


def state_owner(model: nn.Module) -> nn.Module:
    """The module whose state DCP reads and writes: DDP's inner module, else the model itself (FSDP2 shards in place).
    The keys are the same either way (DCP strips DDP's `module.`), but through the wrapper torch 2.11 puts the prefix
    back module by module and skips a module registered under two names: D-FINE's `class_embed` is also its
    decoder's, and every resume of it failed with "Missing key(s)" on torch 2.11 (torch 2.14 handles it)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def save_state(model: nn.Module, optimizer: torch.optim.Optimizer, rank_state: dict[str, torch.Tensor],
               world: World) -> dict[str, Any]:
    """Collective: the DCP state dict of one rank: model, optimizer (sharded under FSDP) and this rank's own state.

    DCP writes one copy of a tensor every rank holds, from a rank of its planner's choosing, and a
    resume loads that copy on every rank; so the ranks first agree on rank 0's buffers, those the
    next step uses (DDP broadcasts them at its next forward).
    """
    agree_buffers(model, world)
    owner = state_owner(model)
    return {
        "model": get_model_state_dict(owner),
        "optim": get_optimizer_state_dict(owner, optimizer),
        _rank_key(world.rank): rank_state,
    }


def commit(d: Path, step: int, trainer_state: dict[str, Any], world_size: int,
           metric: dict[str, float] | None = None) -> None:
    """Rank 0, once every rank's shards are durable: write state.json, then the marker (last)."""
    _fsync_write(d / STATE_FILE, json.dumps(trainer_state, indent=1))
    files = listing(d)
    marker = {
        "step": step,
        "world_size": world_size,
        "signature": trainer_state.get("signature"),
        "time": time.time(),
        "files": files,
        "sha256": {name: sha256(d / name) for name in files},
        "metric": metric or {},
    }
    _fsync_write(d / MARKER, json.dumps(marker, indent=1))


def retain(root: Path, keep_last: int, keep_best: int = 0, best_metric: str | None = None,
           best_mode: str = "max") -> list[Path]:
    """Delete committed checkpoints beyond the newest `keep_last` and the `keep_best` best, and
    unfinished ones older than the newest commit; return what was deleted."""
    committed = committed_checkpoints(root, warn=False)
    keep = {c.path for c in committed[-keep_last:]}
    if keep_best and best_metric:
        keep |= {c.path for c in by_score(committed, best_metric, best_mode)[:keep_best]}
    newest = committed[-1].step if committed else -1
    deleted = []
    for d in sorted(root.iterdir()):
        m = CHECKPOINT_DIR.match(d.name)
        if not m or d in keep:
            continue
        if int(m.group(1)) < newest:
            shutil.rmtree(d, ignore_errors=True)
            deleted.append(d)
    return deleted


def save_checkpoint(
    root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    rank_state: dict[str, torch.Tensor],
    world: World,
    keep_last: int,
    metric: dict[str, float] | None = None,
) -> Path:
    """Collective, synchronous: every rank's shards, then rank 0's commit and retention.

    The training loop saves through `saver.Checkpointer` (asynchronous by default); this is the
    same sequence without the background part, for tools and tests that write a checkpoint.
    """
    d = prepare_dir(root, step, world)
    dcp.save(save_state(model, optimizer, rank_state, world), checkpoint_id=str(d))
    if world.is_main:  # dcp.save returned after rank 0 gathered every rank's write result
        commit(d, step, json.loads(json.dumps(trainer_state)), world.size, metric)
        retain(root, keep_last)
    world.barrier()
    return d


def load_checkpoint(
    ckpt: Committed,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    rank_template: dict[str, torch.Tensor],
    world: World,
    signature: str,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Collective: check compatibility, load shards into model/optimizer; return (trainer, rank) state."""
    marker = ckpt.marker
    if marker.get("signature") not in (None, signature):
        raise ConfigError(
            f"{ckpt.path}: checkpoint is of another model (signature {marker.get('signature')} != {signature}); "
            "resume with the job that wrote it or start a new run directory"
        )
    if int(marker.get("world_size", world.size)) != world.size:
        raise ConfigError(
            f"{ckpt.path}: written by {marker['world_size']} ranks, this run has {world.size}; exact resume "
            f"needs the same world size: use --nproc {marker['world_size']}"
        )
    trainer_state = json.loads((ckpt.path / STATE_FILE).read_text(encoding="utf-8"))
    owner = state_owner(model)
    state: dict[str, Any] = {
        "model": get_model_state_dict(owner),
        "optim": get_optimizer_state_dict(owner, optimizer),
        _rank_key(world.rank): rank_template,
    }
    reader = SafeFileSystemReader(str(ckpt.path))
    try:
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner())
    except (Exception, CheckpointException) as e:  # DCP wraps per-rank failures in CheckpointException
        raise ConfigError(
            f"{ckpt.path}: cannot be loaded ({reader.refusal_or(e)}); move it aside to resume from an earlier one"
        ) from None
    set_model_state_dict(owner, state["model"])
    set_optimizer_state_dict(owner, optimizer, state["optim"])
    return trainer_state, state[_rank_key(world.rank)]


def read_full_state(ckpt_dir: Path, verified: bool = False, keys: frozenset[str] | None = None) -> dict[str, Any]:
    """The whole checkpoint (or only its top-level entries `keys`, e.g. {"model"}) as one state dict on the CPU,
    without a process group.

    Read through `safe_dcp`: the metadata with an allow-listed unpickler, tensors and
    other entries with weights_only=True: nothing is unpickled beyond tensors and containers.
    `verified`: the caller found it with latest_checkpoint(checksums=True) just before, so its SHA-256 is not
    computed twice (for a 124 M-parameter GPT with AdamW, 1.5 GB hashed once more).
    """
    if not verified and verify(Path(ckpt_dir), checksums=True) is None:
        raise ConfigError(f"{ckpt_dir}: not a committed, intact checkpoint (marker, sizes, SHA-256); pick another "
                          "step directory")
    try:
        return full_state(Path(ckpt_dir), keys)
    except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
        raise ConfigError(f"{ckpt_dir}: cannot be loaded ({describe_failure(e)}); pick another step directory"
                          ) from None
