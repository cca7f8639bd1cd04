"""The attempts of a fleet as RUN/fleet.json recorded them: what the replay simulates and the report draws."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Attempt:
    """One recorded attempt: when it started and released its GPUs, when it ended (seconds from the first
    start), its GPUs and how it ended."""

    name: str  # job, or job#N for the N-th attempt after the first
    job: str
    gpus: tuple[int, ...]
    start: float
    released: float
    end: float
    outcome: str
    shared_with: tuple[str, ...] = ()  # jobs that shared its GPU (machine.share_gpus)


def attempts_of(record: dict[str, Any]) -> list[Attempt]:
    """Every attempt fleet.json recorded (per-attempt history; a job without one: its latest attempt)."""
    raw: list[tuple[str, dict[str, Any]]] = []
    for job, st in (record.get("jobs") or {}).items():
        hist = st.get("history") or ([{"gpus": st.get("gpus") or list(range(st.get("width") or 1)),
                                       "started": st.get("started"), "ended": st.get("ended"),
                                       "outcome": st.get("state")}] if st.get("started") is not None else [])
        raw += [(job, h) for h in hist if isinstance(h.get("started"), (int, float))
                and isinstance(h.get("ended"), (int, float))]
    if not raw:
        return []
    t0 = min(h["started"] for _, h in raw)
    out, seen = [], {}
    for job, h in sorted(raw, key=lambda jh: jh[1]["started"]):
        n = seen[job] = seen.get(job, -1) + 1
        released = h["released"] if isinstance(h.get("released"), (int, float)) else h["ended"]
        out.append(Attempt(job if n == 0 else f"{job}#{n}", job, tuple(h.get("gpus") or (0,)), h["started"] - t0,
                           released - t0, h["ended"] - t0, str(h.get("outcome") or ""),
                           tuple(str(n) for n in h.get("shared_with") or ())))
    return out
