"""Chrome-trace / Perfetto JSON of the spans: one process per rank, a host track and (GPU) a device track.

Open in https://ui.perfetto.dev or chrome://tracing. Device spans are placed on
the host timeline through the recorder's anchor event (one synchronize at setup).

A long run is not traced whole (about 1 KB per rank per step: chrome://tracing cannot
open a trace of 100k steps): at most `max_steps` steps per job are kept, the slowest
steps first (checkpoints, evaluations, stalls: the ones worth opening), then the first
steps and the last ones. `otherData` says how many were left out.
"""

from __future__ import annotations

from typing import Any

from musubi.diagnose.timeline import JobTelemetry
from musubi.telemetry.step_record import wall_ms

MAX_STEPS = 2000  # steps per job in the trace (0: all)
FIRST_STEPS = 50  # the start of the run is kept (warm-up, compilation)


def _kept_steps(job: JobTelemetry, max_steps: int) -> set[int] | None:
    """The steps of `job` to trace (None: all of them)."""
    walls: dict[int, float] = {}
    for recs in job.steps.values():
        for r in recs:
            k = int(r["step"])
            walls[k] = max(walls.get(k, 0.0), wall_ms(r))
    if not max_steps or len(walls) <= max_steps:
        return None
    order = sorted(walls)
    keep = set(order[:FIRST_STEPS])
    typical = sorted(walls.values())[len(walls) // 2]
    slow = sorted((k for k, w in walls.items() if w >= 2 * typical), key=lambda k: -walls[k])
    keep.update(slow[: max_steps // 4])
    for k in reversed(order):  # the end of the run fills the rest
        if len(keep) >= max_steps:
            break
        keep.add(k)
    return keep


def chrome_trace(jobs: list[JobTelemetry], max_steps: int = MAX_STEPS) -> dict[str, Any]:
    """Trace events (complete events, microseconds) for every job's ranks."""
    events: list[dict[str, Any]] = []
    left_out: dict[str, int] = {}
    t0 = min((r["t"] for j in jobs for recs in j.steps.values() for r in recs[:1]), default=0.0)
    for ji, job in enumerate(jobs):
        keep = _kept_steps(job, max_steps)
        if keep is not None:
            left_out[job.name] = len({int(r["step"]) for recs in job.steps.values() for r in recs}) - len(keep)
        for rank, recs in sorted(job.steps.items()):
            pid = ji * 10_000 + rank
            events.append({"ph": "M", "name": "process_name", "pid": pid,
                           "args": {"name": f"{job.name} rank {rank}"}})
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "host"}})
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "device"}})
            shown = recs if keep is None else [r for r in recs if int(r["step"]) in keep]
            for r in [*shown, *([job.tails[rank]] if rank in job.tails else [])]:
                base = (r["t"] - t0) * 1e6
                for key, tid in (("spans", 0), ("gpu_spans", 1)):
                    for name, start_ms, dur_ms in r.get(key, []):
                        events.append({"ph": "X", "name": name, "cat": key, "pid": pid, "tid": tid,
                                       "ts": round(base + start_ms * 1e3, 1), "dur": round(dur_ms * 1e3, 1),
                                       "args": {"step": r["step"]}})
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if left_out:
        out["otherData"] = {"steps_left_out": left_out,
                            "note": f"at most {max_steps} steps per job: the slowest, the first {FIRST_STEPS} "
                                    "and the last; `musubi report --steps A:B` or --trace-steps 0 for others"}
    return out
