"""Chrome-trace / Perfetto JSON of the spans: one process per rank, a host track and (GPU) a device track.

Open in https://ui.perfetto.dev or chrome://tracing. Device spans are placed on
the host timeline through the recorder's anchor event (one synchronize at setup).
"""

from __future__ import annotations

from typing import Any

from musubi.diagnose.timeline import JobTelemetry


def chrome_trace(jobs: list[JobTelemetry]) -> dict[str, Any]:
    """Trace events (complete events, microseconds) for every job's ranks."""
    events: list[dict[str, Any]] = []
    t0 = min((r["t"] for j in jobs for recs in j.steps.values() for r in recs[:1]), default=0.0)
    for ji, job in enumerate(jobs):
        for rank, recs in sorted(job.steps.items()):
            pid = ji * 10_000 + rank
            events.append({"ph": "M", "name": "process_name", "pid": pid,
                           "args": {"name": f"{job.name} rank {rank}"}})
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "host"}})
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "device"}})
            for r in [*recs, *([job.tails[rank]] if rank in job.tails else [])]:
                base = (r["t"] - t0) * 1e6
                for key, tid in (("spans", 0), ("gpu_spans", 1)):
                    for name, start_ms, dur_ms in r.get(key, []):
                        events.append({"ph": "X", "name": name, "cat": key, "pid": pid, "tid": tid,
                                       "ts": round(base + start_ms * 1e3, 1), "dur": round(dur_ms * 1e3, 1),
                                       "args": {"step": r["step"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
