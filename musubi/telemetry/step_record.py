"""One step record of `rank{r}.jsonl` read back: its section times and wall time, on the clock they share.

The live straggler watch (rank 0, during training) and the report (after it) read records through these.
"""

from __future__ import annotations

from typing import Any

#: Sections that are a rank's own work (no collective inside): what straggler scores compare.
LOCAL_WORK = ("data", "h2d", "forward", "backward", "optimizer")


def sections_ms(rec: dict[str, Any]) -> dict[str, float]:
    """A step's section times: device time where CUDA events were resolved, host time otherwise."""
    return rec.get("gpu") or rec.get("host") or {}


def wall_ms(rec: dict[str, Any]) -> float:
    """A step's wall time on the clock its sections use."""
    return float(rec.get("gpu_wall_ms") or rec.get("wall_ms") or 0.0)


def local_work_ms(rec: dict[str, Any]) -> float:
    """Time a rank spent on its own work in a step (no waiting for peers)."""
    s = sections_ms(rec)
    return sum(s.get(k, 0.0) for k in LOCAL_WORK)
