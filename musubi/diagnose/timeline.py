"""Reading a job's telemetry back: step records per rank, hardware samples, memory figures, live flags."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musubi.contract.run_files import RUN_FILES
from musubi.store.rundir import read_jsonl


@dataclass
class JobTelemetry:
    """Everything a job's telemetry folder holds, by rank."""

    name: str
    path: Path
    steps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # rank -> step records in order
    tails: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> what ran after the last step
    memory: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    samples: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    flags: list[dict[str, Any]] = field(default_factory=list)  # live straggler flags (rank 0's watch)
    job: dict[str, Any] = field(default_factory=dict)  # job.json

    @property
    def ranks(self) -> list[int]:
        """Ranks that recorded steps."""
        return sorted(self.steps)

    @property
    def on_gpu(self) -> bool:
        """True when steps carry CUDA event times."""
        return any("gpu" in r for recs in self.steps.values() for r in recs[:1])

    def aligned(self, first: int | None = None, last: int | None = None) -> list[tuple[int, dict[int, dict]]]:
        """(step, {rank: record}) for the steps every rank recorded, within [first, last]."""
        by_step: dict[int, dict[int, dict]] = {}
        for rank, recs in self.steps.items():
            for r in recs:
                by_step.setdefault(int(r["step"]), {})[rank] = r
        n = len(self.steps)
        return [(k, v) for k, v in sorted(by_step.items()) if len(v) == n
                and (first is None or k >= first) and (last is None or k <= last)]


    def window(self, first: int | None = None, last: int | None = None) -> JobTelemetry:
        """A copy holding optimizer steps [first, last] only, and the samples, memory figures and live
        flags of that stretch (what the plots and the trace of `musubi report --steps` show)."""
        if first is None and last is None:
            return self

        def inside(k: Any) -> bool:
            return isinstance(k, int) and (first is None or k >= first) and (last is None or k <= last)

        steps = {r: [x for x in recs if inside(x.get("step"))] for r, recs in self.steps.items()}
        steps = {r: recs for r, recs in steps.items() if recs}
        starts = [x["t"] for recs in steps.values() for x in recs]
        ends = [x["t"] + float(x.get("wall_ms", 0.0)) / 1e3 for recs in steps.values() for x in recs]
        t0, t1 = (min(starts), max(ends)) if starts else (0.0, -1.0)
        return JobTelemetry(
            name=self.name, path=self.path, steps=steps,
            tails=dict(self.tails) if last is None else {},
            memory={r: [x for x in recs if inside(x.get("step"))] for r, recs in self.memory.items()},
            samples={r: [x for x in recs if t0 <= float(x.get("t", 0.0)) <= t1] for r, recs in self.samples.items()},
            flags=[f for f in self.flags if inside(f.get("step"))], job=self.job)


def load_job(job_dir: Path) -> JobTelemetry:
    """Read JOB/telemetry/ (and job.json); steps deduplicated to the latest attempt's records."""
    tele = JobTelemetry(name=job_dir.name, path=job_dir)
    try:
        tele.job = json.loads((job_dir / RUN_FILES.job).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tele.job = {}
    d = job_dir / RUN_FILES.telemetry
    for p in sorted(d.glob("rank*.jsonl")):
        try:
            rank = int(p.stem[4:])
        except ValueError:
            continue
        steps: dict[int, dict] = {}
        for rec in read_jsonl(p):
            kind = rec.get("kind")
            if kind == "step" and isinstance(rec.get("step"), int):
                steps[rec["step"]] = rec  # a restart redoes steps: the later record wins
            elif kind == "tail":
                tele.tails[rank] = rec
            elif kind == "memory":
                tele.memory.setdefault(rank, []).append(rec)
        if steps:
            tele.steps[rank] = [steps[k] for k in sorted(steps)]
    for p in sorted(d.glob("sampler-rank*.jsonl")):
        try:
            rank = int(p.stem.removeprefix("sampler-rank"))
        except ValueError:
            continue
        tele.samples[rank] = [r for r in read_jsonl(p) if r.get("kind") == "sample"]
    tele.flags = read_jsonl(d / "stragglers.jsonl")
    return tele


def job_dirs(run: Path) -> list[Path]:
    """The job folders of a run directory (or the run itself when it is one job's folder)."""
    if (run / RUN_FILES.telemetry).is_dir():
        return [run]
    return sorted(p for p in run.iterdir() if p.is_dir() and (p / RUN_FILES.telemetry).is_dir())
