"""What a rank restarted by torchrun does first: stop on a repeated failure, take the safer precision,
clear a killed rank's checkpoint process, and say what the failed attempt cost."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from musubi.checkpoint.daemons import reap_checkpoint_daemons
from musubi.contract.world import World, attempt_id
from musubi.recovery.goodput import attempt_failure, failure_summary, repeated_failure
from musubi.recovery.numerics import clear_pending, current_precision
from musubi.recovery.repeats import defect_line

log = logging.getLogger("musubi.worker")


def stop_on_repeat(job_dir: Path, world: World, launch: int, restarts: int) -> str | None:
    """The defect line when the two attempts before this one failed the same way (agreed by every rank), else None.

    Rank 0 reads the records; one all-reduce makes its verdict every rank's (recovery/repeats.py)."""
    line = None
    if world.is_main:
        try:
            defect = repeated_failure(job_dir, launch, restarts)
        except (OSError, ValueError, KeyError) as e:  # unreadable records: restart as before
            log.warning("could not compare the last two failures (%s): restarting", e)
            defect = None
        line = defect_line(job_dir.name, defect) if defect else None
    if not world.all_reduce_max(int(line is not None)):
        return None
    return line or "the same failure struck again after a restart (rank 0 has the details): a defect"


def reap_after_restart(job_dir: Path, restarts: int) -> None:
    """Log the restart and end the checkpoint process a killed rank left behind (it outlives its rank)."""
    log.warning("restart %d of this job (torchrun)", restarts)
    reap_checkpoint_daemons(job_dir, skip_attempt=attempt_id())


def restart_precision(job_dir: Path, world: World, precision: str) -> str:
    """The precision in force after a non-finite loss (a safer one than configured), agreed before training."""
    bf16_ok = world.device.type != "cuda" or torch.cuda.is_bf16_supported()
    precision = current_precision(job_dir, precision, bf16_ok, world.is_main)
    world.barrier()  # every rank read the fault, rank 0 moved bad checkpoints aside
    if world.is_main:
        clear_pending(job_dir)
    return precision


def log_gap(job_dir: Path, restarts: int, resumed_step: int) -> None:
    """One line on the failed previous attempt: its cause, the step it reached, the steps to redo, the downtime."""
    now = attempt_id()
    prev = f"{now.split('.')[0]}.{restarts - 1}"
    try:
        failed = attempt_failure(job_dir, prev)
    except (OSError, ValueError, KeyError) as e:  # bookkeeping never stops the restart
        log.warning("attempt %s after %s failed (its record is unreadable: %s)", now, prev, e)
        return
    reached = failed["reached_step"]
    log.warning("attempt %s after %s failed (%s): it reached step %d, resumed from step %d: %d step(s) to redo, "
                "%.1f s down", now, prev, failure_summary(failed), reached, resumed_step,
                max(0, reached - resumed_step), max(0.0, time.time() - failed["end"]))
