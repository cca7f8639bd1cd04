"""Numerical guard: a non-finite loss rolls the job back to its last good checkpoint in a safer precision.

Detection is where the loop already synchronises: at each log interval the ranks all-reduce the
loss, so every rank sees the same non-finite mean at the same step and stops together (no rank
is left waiting in a collective). Each rank writes `JOB/numerics/nonfinite-rank{r}.json` and
exits with EXIT_NUMERICS (contract/exits.py); torchrun restarts the job (as after an OOM), and at start:

- the precision steps down: fp16 -> bf16 (where the GPU has it) -> fp32, bf16 -> fp32;
- checkpoints taken after the last log interval whose loss was finite are moved to
  `checkpoints/quarantine/` (they may hold NaN weights), so the job resumes from the newest
  checkpoint before the fault (or from the start).

In fp32 there is nothing safer, but a non-finite loss need not come from the precision: a flipped bit, a
bad read of a batch, an injected fault. So the job rolls back once more and retries in fp32; only when
the loss is non-finite again at the same step (the last rollback was from that step and ran in fp32:
`ends_job`) does it fail, with a one-line cause (lower the learning rate). A deterministic divergence
comes back at the same step and ends the job after one retry; `train.max_restarts` bounds every restart.
Every fallback is kept in `JOB/numerics/applied.json` and reported by the checklist; `trained_precision`
sums it up for the evaluation step (eval.json), the fleet (fleet.json), the leaderboard and the manifest.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from musubi.contract.run_files import RUN_FILES

log = logging.getLogger("musubi")

#: The next safer precision.
SAFER = {"fp16": "bf16", "bf16": "fp32"}


def numerics_dir(job_dir: Path) -> Path:
    return job_dir / RUN_FILES.numerics


def record_nonfinite(job_dir: Path, rank: int, step: int, last_good_step: int, precision: str, detail: str) -> Path:
    """This rank's record of the fault (written atomically: torchrun may stop the rank right after)."""
    d = numerics_dir(job_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"nonfinite-rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rank": rank, "step": step, "last_good_step": last_good_step,
                               "precision": precision, "detail": detail[:500], "time": time.time()}),
                   encoding="utf-8")
    os.replace(tmp, path)
    return path


def pending_fault(job_dir: Path) -> dict[str, Any] | None:
    """The fault the previous attempt stopped on, not yet applied (the earliest good step of any rank)."""
    d = numerics_dir(job_dir)
    recs = []
    for p in sorted(d.glob("nonfinite-rank*.json")) if d.is_dir() else []:
        try:
            recs.append(json.loads(p.read_text(encoding="utf-8")))
        except ValueError:
            continue
    if not recs:
        return None
    return min(recs, key=lambda r: r["last_good_step"])


def safer_precision(precision: str, bf16_ok: bool) -> str | None:
    """The next precision to try, or None when there is none."""
    nxt = SAFER.get(precision)
    if nxt == "bf16" and not bf16_ok:
        nxt = "fp32"
    return nxt


def ends_job(job_dir: Path, step: int, precision: str) -> bool:
    """Whether a non-finite loss seen at `step` in `precision` ends the job: in fp32, when the last rollback
    was from this same step and retried in fp32 already (a divergence that repeats, not a transient fault)."""
    if safer_precision(precision, True) is not None:
        return False
    applied = applied_fallbacks(job_dir)
    last = applied[-1] if applied else None
    return last is not None and last.get("to") == "fp32" and int(last.get("step", -1)) == step


def current_precision(job_dir: Path, configured: str, bf16_ok: bool, is_main: bool) -> str:
    """The precision to run in at (re)start: one step safer than the fault's if a fault is pending (fp32 after a
    fault in fp32: the retry; rank 0 then moves the checkpoints after its last good step aside and logs it), else
    the last fallback applied in this job, else the configured one. Every rank gets the same answer."""
    fault = pending_fault(job_dir)
    applied = applied_fallbacks(job_dir)
    if fault is None:
        return applied[-1]["to"] if applied else configured
    nxt = safer_precision(fault["precision"], bf16_ok) or "fp32"
    if is_main:
        moved = quarantine_after(job_dir / RUN_FILES.checkpoints, int(fault["last_good_step"]))
        applied.append({"step": fault["step"], "last_good_step": fault["last_good_step"], "from": fault["precision"],
                        "to": nxt, "quarantined": moved, "detail": fault.get("detail")})
        (numerics_dir(job_dir) / RUN_FILES.applied).write_text(json.dumps(applied, indent=1), encoding="utf-8")
        retry = " (a retry: nothing is safer; the job ends if the loss is non-finite at this step again)" \
            if nxt == fault["precision"] else ""
        log.warning("non-finite loss at step %d in %s: rolled back to the last good checkpoint (step <= %d) and "
                    "continuing in %s%s%s", fault["step"], fault["precision"], fault["last_good_step"], nxt, retry,
                    f"; quarantined {', '.join(moved)}" if moved else "")
    return nxt


def clear_pending(job_dir: Path) -> None:
    """After every rank read the fault (a barrier later): the records are applied."""
    d = numerics_dir(job_dir)
    for p in d.glob("nonfinite-rank*.json") if d.is_dir() else []:
        p.unlink(missing_ok=True)


def quarantine_after(ckpt_root: Path, last_good_step: int) -> list[str]:
    """Move checkpoints of steps after `last_good_step` to ckpt_root/quarantine/ (kept, never loaded)."""
    from musubi.checkpoint.checkpoint import committed_checkpoints

    moved = []
    for c in committed_checkpoints(ckpt_root):
        if c.step > last_good_step:
            dest = ckpt_root / RUN_FILES.quarantine / c.path.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(c.path), str(dest))
            moved.append(c.path.name)
    return moved


def applied_fallbacks(job_dir: Path) -> list[dict[str, Any]]:
    """Every precision fallback of this job (for the checklist)."""
    path = numerics_dir(job_dir) / RUN_FILES.applied
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def trained_precision(job_dir: Path) -> dict[str, Any] | None:
    """{"requested", "final", "fallbacks": [{"step", "from", "to"}]} of a task job, or None before it trained.

    `final` is the precision the last attempt trained in (summary.json), so `precision: auto` records what
    the evidence left it at: bf16 on GPU, or fp32 after a non-finite loss.
    """
    try:
        summary = json.loads((job_dir / RUN_FILES.summary).read_text(encoding="utf-8"))
        final = summary.get("precision") if isinstance(summary, dict) else None
    except (OSError, ValueError):
        final = None
    if not isinstance(final, str):
        return None
    try:
        config = json.loads((job_dir / RUN_FILES.job).read_text(encoding="utf-8")).get("config") or {}
        requested = (config.get("train") or {}).get("precision")
    except (OSError, ValueError, AttributeError):
        requested = None
    fallbacks = [{k: f.get(k) for k in ("step", "from", "to")} for f in applied_fallbacks(job_dir)]
    return {"requested": requested, "final": final, "fallbacks": fallbacks}
