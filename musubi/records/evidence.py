"""Readers of what a run directory holds, for the checklist and `musubi compare` (no torch).

Every reader tolerates a missing or half-written file (a crashed run is still a run to
judge): it returns None or an empty value, and the checklist says "not measured".
"""

from __future__ import annotations

import functools
import json
import socket
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musubi.config.success import SuccessSpec
from musubi.contract.run_files import RUN_FILES

# One reader of JSON-lines records (torn lines skipped) and of the telemetry's step records.
from musubi.store.rundir import read_jsonl as _read_jsonl
from musubi.telemetry.step_record import sections_ms, wall_ms

#: Log records skipped at the start of a job when judging throughput (cudnn autotuning, warm-up).
WARMUP_RECORDS = 1


@functools.lru_cache(maxsize=32)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[dict[str, Any], ...]:
    return tuple(_read_jsonl(Path(path)))


def read_jsonl(path: Path) -> tuple[dict[str, Any], ...]:
    """The records of a JSON-lines file, parsed once while it stays unchanged (same size and modification
    time): a job's telemetry is read by several readers (its ranks' last steps, GPU utilisation and memory,
    data waits), and the checklist parsed every rank file three times, seconds after a large fleet's last job
    (BENCHMARKS.md, fleet). The records are shared: readers must not change them."""
    try:
        st = path.stat()
    except OSError:
        return ()
    return _parsed(str(path), st.st_mtime_ns, st.st_size)


def read_json_or_none(path: Path) -> Any:
    """The JSON document at `path`, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass
class JobEvidence:
    """One job of a run: where it is and how it ended."""

    name: str
    dir: Path
    kind: str  # task | command
    state: str  # done | failed | stopped | running | queued | ...
    gpus: int
    device: str = "cuda"  # cuda | cpu (job.json); criteria on speed are judged on GPU runs only
    success: SuccessSpec = field(default_factory=SuccessSpec)  # the job's own `success:` (job.json)


@dataclass
class RunEvidence:
    """A run directory: its jobs, preflight and criteria."""

    dir: Path
    fleet: bool
    jobs: list[JobEvidence] = field(default_factory=list)
    preflight: dict[str, Any] | None = None
    preflight_skipped: bool = False
    success: SuccessSpec = field(default_factory=SuccessSpec)
    export_top: int = 0
    config: dict[str, Any] = field(default_factory=dict)


def _success_of(raw: Any) -> SuccessSpec:
    try:
        return SuccessSpec.model_validate(raw) if isinstance(raw, dict) else SuccessSpec()
    except ValueError:  # a record written by another version: judge with the defaults
        return SuccessSpec()


def read_run(run_dir: Path) -> RunEvidence:
    """The jobs of a `musubi run` (fleet.json) or `musubi train` (one job directory) run."""
    fleet = read_json_or_none(run_dir / RUN_FILES.fleet)
    run = read_json_or_none(run_dir / RUN_FILES.run) or {}
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    ev = RunEvidence(run_dir, fleet=isinstance(fleet, dict), preflight=read_json_or_none(run_dir / RUN_FILES.preflight),
                     config=config)
    if isinstance(fleet, dict):
        ev.success = _success_of(config.get("success"))
        ev.export_top = int((config.get("leaderboard") or {}).get("export_top", 1))
        for name, st in sorted((fleet.get("jobs") or {}).items()):
            job = read_json_or_none(run_dir / name / RUN_FILES.job) or {}
            own = job.get("config") if isinstance(job.get("config"), dict) else {}
            ev.jobs.append(JobEvidence(name, run_dir / name, "task" if st.get("kind") == "task" else "command",
                                       str(st.get("state", "unknown")), max(1, len(st.get("gpus") or [])
                                                                             or int(job.get("nproc") or 1)),
                                       str(job.get("device") or "cuda"), _success_of(own.get("success"))))
        # A fleet checks once for all its jobs (they start with --no-check); the fleet's own flag counts.
        ev.preflight_skipped = "--no-check" in (run.get("argv") or [])
        return ev
    for job_dir in sorted(p for p in run_dir.iterdir() if p.is_dir() and (p / RUN_FILES.job).is_file()):
        job = read_json_or_none(job_dir / RUN_FILES.job) or {}
        own = job.get("config") if isinstance(job.get("config"), dict) else {}
        ev.jobs.append(JobEvidence(job_dir.name, job_dir, "task", str(job.get("status", "unknown")),
                                   int(job.get("nproc") or 1), str(job.get("device") or "cuda"),
                                   _success_of(own.get("success"))))
        ev.preflight_skipped = ev.preflight_skipped or "skipped" in str(job.get("preflight", ""))
        if isinstance(job.get("config"), dict):
            ev.success = _success_of(job["config"].get("success"))
            ev.config = job["config"]
    return ev


def metric_records(job_dir: Path) -> list[dict[str, Any]]:
    """Rank 0's scalar records (metrics.jsonl): kind 'train' (loss, lr, samples/s) and 'val', per step."""
    return list(read_jsonl(job_dir / RUN_FILES.metrics))


def train_records(job_dir: Path) -> list[dict[str, Any]]:
    """Rank 0's training log records (metrics.jsonl, kind 'train')."""
    return [r for r in metric_records(job_dir) if r.get("kind") == "train"]


def val_records(job_dir: Path) -> list[dict[str, Any]]:
    """Rank 0's validation records (metrics.jsonl, kind 'val'), in step order."""
    return [r for r in metric_records(job_dir) if r.get("kind") == "val"]


#: The headline metric of each built-in task (musubi/tasks: `Task.primary_metric`), for a job without eval.json.
TASK_PRIMARY = {"classification": "top1", "detection": "map50", "lm": "val_acc"}


def job_config(job_dir: Path) -> dict[str, Any]:
    """job.json's resolved config ({} when absent)."""
    rec = read_json_or_none(job_dir / RUN_FILES.job)
    config = rec.get("config") if isinstance(rec, dict) else None
    return config if isinstance(config, dict) else {}


def headline_metric(job_dir: Path) -> str | None:
    """The metric the job is judged by: eval.json's primary metric, else its built-in task's."""
    return primary_metric(job_dir) or TASK_PRIMARY.get(str(job_config(job_dir).get("task")))


def num_classes(job_dir: Path) -> int | None:
    """Classes the model tells apart: the synthetic set's num_classes, else the newest checkpoint's class
    names (state.json "classes"); None when neither says."""
    data = job_config(job_dir).get("data")
    synthetic = data.get("synthetic") if isinstance(data, dict) else None
    if isinstance(synthetic, dict) and isinstance(synthetic.get("num_classes"), int):
        return synthetic["num_classes"]
    for state in sorted((job_dir / RUN_FILES.checkpoints).glob("step-*/state.json"), reverse=True):
        classes = (read_json_or_none(state) or {}).get("classes")
        if isinstance(classes, list) and classes:
            return len(classes)
    return None


def median_rate(records: list[dict[str, Any]], warmup_fraction: float = 0.0) -> float | None:
    """Median samples/s over the log records after warm-up (None: fewer than two records).

    Warm-up: the first record, or the first `warmup_fraction` of them if that is more (a short
    baseline spends a large part of its steps in cudnn autotuning and allocator growth)."""
    rates = [float(r["samples_per_s"]) for r in records if isinstance(r.get("samples_per_s"), (int, float))]
    if len(rates) < WARMUP_RECORDS + 1:
        return None
    rates = rates[max(WARMUP_RECORDS, int(len(rates) * warmup_fraction)):]
    return statistics.median(rates) if rates and min(rates) > 0 else None


def oom_records(job_dir: Path) -> list[dict[str, Any]]:
    """Applied OOM decisions of the job (memory/applied-oom-*.json), else the raw per-rank records."""
    d = job_dir / RUN_FILES.memory
    if not d.is_dir():
        return []
    paths = sorted(d.glob("applied-oom-*.json")) or sorted(d.glob("oom-*.json"))
    return [r for r in (read_json_or_none(p) for p in paths) if isinstance(r, dict)]


def rank_steps(job_dir: Path) -> dict[int, int]:
    """The last step each rank recorded in its telemetry (JOB/telemetry/rank{r}.jsonl or JOB/rank{r}.jsonl)."""
    out: dict[int, int] = {}
    for folder in (job_dir / RUN_FILES.telemetry, job_dir):
        for path in folder.glob("rank*.jsonl"):
            try:
                rank = int(path.stem[4:])
            except ValueError:
                continue
            steps = [int(r["step"]) for r in read_jsonl(path) if isinstance(r.get("step"), int)]
            if steps:
                out[rank] = max(out.get(rank, 0), max(steps))
    return out


def gpu_utilisation(job_dir: Path) -> dict[int, float] | None:
    """Mean utilisation (0-1) per GPU after the first tenth of the samples, from the telemetry sampler
    (JOB/telemetry/sampler-rank{r}.jsonl: `{"kind": "sample", "gpu_index": i, "util": 0-100}`); None: none
    (CPU ranks, or no NVML)."""
    samples: dict[int, list[float]] = {}
    folder = job_dir / RUN_FILES.telemetry
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.jsonl")):
        for r in read_jsonl(path):
            if r.get("kind") not in ("sample", "gpu") or not isinstance(r.get("util"), (int, float)):
                continue
            gpu = next((r[k] for k in ("gpu_index", "gpu", "index", "rank") if isinstance(r.get(k), int)), None)
            if gpu is not None:
                u = float(r["util"])
                samples.setdefault(gpu, []).append(u / 100 if u > 1 else u)
    if not samples:
        return None
    return {g: statistics.fmean(v[len(v) // 10:] or v) for g, v in samples.items()}


def gpu_peak_gib(job_dir: Path) -> float | None:
    """Most GPU memory used on any of the job's GPUs (NVML, GiB: its tensors, allocator cache and CUDA
    context) from the telemetry sampler (JOB/telemetry/sampler-rank{r}.jsonl); None: no GPU samples."""
    folder = job_dir / RUN_FILES.telemetry
    if not folder.is_dir():
        return None
    peaks = [float(r["mem_used_gib"]) for path in sorted(folder.glob("*.jsonl")) for r in read_jsonl(path)
             if r.get("kind") in ("sample", "gpu") and isinstance(r.get("mem_used_gib"), (int, float))]
    return max(peaks) if peaks else None


def data_wait_share(job_dir: Path) -> float | None:
    """Largest per-rank share of step time spent waiting for data (the `data` section of the step
    spans in JOB/telemetry/rank{r}.jsonl, the first tenth of the steps skipped); None: no spans."""
    folder = job_dir / RUN_FILES.telemetry
    if not folder.is_dir():
        return None
    worst = None
    for path in sorted(folder.glob("rank*.jsonl")):
        steps = [r for r in read_jsonl(path) if r.get("kind") == "step" and wall_ms(r) > 0]
        steps = steps[len(steps) // 10:]
        total = sum(wall_ms(r) for r in steps)
        wait = sum(float(sections_ms(r).get("data", 0.0)) for r in steps)
        if total > 0:
            worst = max(worst or 0.0, wait / total)
    return worst


def baseline(job_dir: Path) -> dict[str, Any] | None:
    """The job's single-GPU baseline (RUN/baselines/JOB.json, or JOB/baseline.json), when one was measured."""
    rec = read_json_or_none(job_dir / "baseline.json") or read_json_or_none(
        job_dir.parent / RUN_FILES.baselines / f"{job_dir.name}.json")
    if isinstance(rec, dict) and isinstance(rec.get("samples_per_s"), (int, float)) and rec["samples_per_s"] > 0:
        return rec
    return None


def eval_metrics(job_dir: Path) -> dict[str, float]:
    """eval.json's metrics (numbers only)."""
    rec = read_json_or_none(job_dir / RUN_FILES.eval)
    metrics = rec.get("metrics") if isinstance(rec, dict) else None
    if not isinstance(metrics, dict):
        return {}
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def has_validation_split(job_dir: Path) -> bool | None:
    """Whether job.json's config has a validation split (data.val, or synthetic val_size > 0); None when
    job.json holds no task config (an external job)."""
    rec = read_json_or_none(job_dir / RUN_FILES.job)
    config = rec.get("config") if isinstance(rec, dict) else None
    data = config.get("data") if isinstance(config, dict) and "task" in config else None
    if not isinstance(data, dict):
        return None
    synthetic = data.get("synthetic")
    if isinstance(synthetic, dict):
        return synthetic.get("val_size") != 0  # absent: the default, which validates
    return data.get("val") is not None


def primary_metric(job_dir: Path) -> str | None:
    """The headline metric eval.json names."""
    rec = read_json_or_none(job_dir / RUN_FILES.eval)
    return rec.get("primary_metric") if isinstance(rec, dict) else None


def leaderboard_rows(run_dir: Path) -> list[dict[str, Any]]:
    """RUN/leaderboard.json's rows ([] when absent)."""
    rec = read_json_or_none(run_dir / RUN_FILES.leaderboard)
    rows = rec.get("rows", rec) if isinstance(rec, dict) else rec
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def machine_key(env: dict[str, Any] | None) -> tuple[Any, ...]:
    """What makes two runs "the same machine" for throughput comparison: host and GPU models."""
    env = env or {}
    gpus = tuple(sorted(str(g.get("name")) for g in env.get("gpus") or [] if isinstance(g, dict)))
    return (env.get("host") or socket.gethostname(), gpus)


def earlier_rates(job_dir: Path) -> list[float]:
    """Median samples/s of the same job (same name, config, GPU count and device) in earlier runs beside this
    run (the run directory's parent) on the same machine; newest first, at most 10."""
    run_dir = job_dir.parent
    parent = run_dir.parent
    me = read_json_or_none(job_dir / RUN_FILES.job) or {}
    key = machine_key(read_json_or_none(run_dir / RUN_FILES.env))
    mine = (me.get("nproc"), me.get("device"), json.dumps(me.get("config"), sort_keys=True))
    out: list[float] = []
    try:
        here = run_dir.resolve()  # once: a runs folder holds hundreds of runs
        runs = sorted((p for p in parent.iterdir() if p.is_dir() and p.resolve() != here),
                      key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return out
    for run in runs:
        other = run / job_dir.name
        if not (other / RUN_FILES.metrics).is_file() or run.stat().st_mtime > run_dir.stat().st_mtime + 1:
            continue
        rec = read_json_or_none(other / RUN_FILES.job) or {}
        theirs = (rec.get("nproc"), rec.get("device"), json.dumps(rec.get("config"), sort_keys=True))
        if theirs != mine or rec.get("status") not in ("done", "stopped"):
            continue
        if machine_key(read_json_or_none(run / RUN_FILES.env)) != key:
            continue
        rate = median_rate(train_records(other))
        if rate is not None:
            out.append(rate)
        if len(out) >= 10:
            break
    return out


def precision_fallbacks(job_dir: Path) -> list[dict[str, Any]]:
    """The numerical guard's fallbacks of a job (JOB/numerics/applied.json, see recovery/numerics.py)."""
    data = read_json_or_none(job_dir / RUN_FILES.numerics / RUN_FILES.applied)
    return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []
