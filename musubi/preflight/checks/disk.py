"""Disk check: the run directory's file system holds the checkpoints the run will keep."""

from __future__ import annotations

from musubi.preflight.readings import DiskReading
from musubi.preflight.result import CheckResult, fail, passed, warn
from musubi.preflight.units import gib

#: Without a checkpoint estimate, less free space than this still warns (logs, telemetry, one small model).
MIN_FREE_BYTES = 5 << 30
#: Free space below this multiple of the need warns: logs, telemetry and exports also land there.
HEADROOM = 1.5


def checkpoint_bytes_estimate(params: int, optimizer_slots: int = 2, ema: bool = False) -> int:
    """Bytes of one checkpoint: fp32 weights + optimizer slots (AdamW: 2, SGD momentum: 1) (+ an EMA copy)."""
    return params * 4 * (1 + optimizer_slots + (1 if ema else 0))


def check_disk(disk: DiskReading, ckpt_bytes: int | None, keep: int) -> list[CheckResult]:
    """Free space at --out against keep+1 checkpoints (a new one is written before the oldest is deleted)."""
    where = f"{disk.probed}" if disk.probed == disk.path.absolute() else f"{disk.probed} (for {disk.path})"
    if disk.error is not None:
        return [fail("disk", f"cannot read free space at {where}: {disk.error}", "choose another --out")]
    if not disk.writable:
        return [fail("disk", f"{where} is not writable by this user", "choose another --out or fix its permissions")]
    free = f"{gib(disk.free_bytes)} free of {gib(disk.total_bytes)} at {where}"
    if ckpt_bytes is None:
        if disk.free_bytes < MIN_FREE_BYTES:
            return [warn("disk", f"{free} (no checkpoint estimate given)",
                         f"free space or choose another --out (keep at least {gib(MIN_FREE_BYTES)})")]
        return [passed("disk", f"{free} (no checkpoint estimate given)")]
    need = ckpt_bytes * (keep + 1)
    need_text = f"{keep}+1 checkpoints x {gib(ckpt_bytes)} = {gib(need)}"
    if disk.free_bytes < need:
        return [fail("disk", f"{free}; the run needs {need_text}",
                     f"free {gib(need - disk.free_bytes)}, lower checkpoint.keep_last, or choose another --out")]
    if disk.free_bytes < HEADROOM * need:
        return [warn("disk", f"{free}; the run needs {need_text}, little headroom for logs and exports",
                     f"free space or choose another --out (aim for {gib(HEADROOM * need)})")]
    return [passed("disk", f"{free}; the run needs {need_text}")]
