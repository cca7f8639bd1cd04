"""`musubi compare RUN_A RUN_B`: what changed between two runs, and how the figures moved.

Changes are read from the records every run writes (run.json / job.json configs, env.json
provenance, fleet.json placement, the dataset version of each job); figures from the jobs'
own logs (throughput, peak memory, step breakdown, GPU utilisation, eval metrics, score).
A throughput drop beyond the threshold (10 % by default) is flagged as a regression.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musubi.contract.env import MUSUBI_RUN_ID
from musubi.contract.run_files import RUN_FILES
from musubi.data.job_version import dataset_version
from musubi.records import evidence

#: Throughput drop (B against A) flagged as a regression.
REGRESSION = 0.10
#: env.json keys that are not provenance: they differ on every run.
_ENV_NOISE = {f"env.{MUSUBI_RUN_ID}", "env.TORCHELASTIC_RUN_ID", "project.changed_files"}


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{'a.b.c': leaf} of nested mappings; lists of mappings by index or by their 'name'/'index' key."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        for i, v in enumerate(obj):
            key = v.get("index", v.get("name", i)) if isinstance(v, dict) else i
            out.update(flatten(v, f"{prefix}{key}."))
    else:
        out[prefix[:-1]] = obj
    return out


def diff(a: Any, b: Any, ignore: set[str] = frozenset()) -> list[dict[str, Any]]:
    """Every leaf that differs: [{'key', 'a', 'b'}] (a key missing on one side shows None there)."""
    fa, fb = flatten(a), flatten(b)
    keys = sorted(set(fa) | set(fb))
    return [{"key": k, "a": fa.get(k), "b": fb.get(k)} for k in keys
            if fa.get(k) != fb.get(k) and k not in ignore]


@dataclass
class JobFigures:
    """What one job of one run measured."""

    samples_per_s: float | None = None
    peak_memory_gib: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    score: float | None = None
    gpu_util: float | None = None
    step_breakdown_s: dict[str, float] = field(default_factory=dict)
    gpus: list[int] = field(default_factory=list)
    state: str | None = None
    dataset: str | None = None


def _breakdown(job_dir: Path) -> dict[str, float]:
    """Mean seconds per step of each recorded section on rank 0 (telemetry step spans), if any."""
    from musubi.telemetry.step_record import sections_ms

    sums: dict[str, list[float]] = {}
    for rec in evidence.read_jsonl(job_dir / RUN_FILES.telemetry / "rank0.jsonl"):
        if rec.get("kind") != "step":
            continue
        for k, v in sections_ms(rec).items():
            if isinstance(v, (int, float)):
                sums.setdefault(k, []).append(float(v) / 1e3)
    return {k: statistics.fmean(v) for k, v in sums.items()}


def job_figures(run_dir: Path, name: str, state: dict[str, Any] | None, board: dict[str, Any]) -> JobFigures:
    job_dir = run_dir / name
    records = evidence.train_records(job_dir)
    peaks = [r["mem_peak_allocated_gib"] for r in records if isinstance(r.get("mem_peak_allocated_gib"), (int, float))]
    util = evidence.gpu_utilisation(job_dir)
    job = evidence.read_json_or_none(job_dir / RUN_FILES.job) or {}
    config = job.get("config") if isinstance(job.get("config"), dict) else None
    try:
        dataset = dataset_version(config) if config and "task" in config else None
    except Exception:  # noqa: BLE001 - a dataset gone since the run: no version, not a crash
        dataset = None
    return JobFigures(
        samples_per_s=evidence.median_rate(records), peak_memory_gib=max(peaks) if peaks else None,
        metrics=evidence.eval_metrics(job_dir), score=board.get("score"),
        gpu_util=statistics.fmean(util.values()) if util else None, step_breakdown_s=_breakdown(job_dir),
        gpus=list((state or {}).get("gpus") or []),
        state=(state or {}).get("state") or job.get("status"), dataset=dataset)


def _jobs(run_dir: Path) -> dict[str, dict[str, Any]]:
    """{job: fleet state or {}} of a run, plus each job's config."""
    fleet = evidence.read_json_or_none(run_dir / RUN_FILES.fleet)
    if isinstance(fleet, dict):
        return {n: s for n, s in (fleet.get("jobs") or {}).items() if isinstance(s, dict)}
    return {p.name: {} for p in sorted(run_dir.iterdir()) if p.is_dir() and (p / RUN_FILES.job).is_file()}


def _change(a: float | None, b: float | None) -> float | None:
    return (b / a - 1) if a and b is not None else None


def compare_runs(run_a: Path, run_b: Path, regression: float = REGRESSION) -> dict[str, Any]:
    """Everything `musubi compare` prints, as data."""
    from musubi.contract.errors import ConfigError

    for run in (run_a, run_b):
        if not run.is_dir() or not _jobs(run):
            raise ConfigError(f"{run}: not a run directory (no fleet.json and no JOB/job.json); give the --out of "
                              "a `musubi run` or `musubi train`")
    env_a, env_b = (evidence.read_json_or_none(r / RUN_FILES.env) or {} for r in (run_a, run_b))
    cfg_a, cfg_b = ((evidence.read_json_or_none(r / RUN_FILES.run) or {}).get("config") or {} for r in (run_a, run_b))
    jobs_a, jobs_b = _jobs(run_a), _jobs(run_b)
    board_a = {r.get("job"): r for r in evidence.leaderboard_rows(run_a)}
    board_b = {r.get("job"): r for r in evidence.leaderboard_rows(run_b)}
    out: dict[str, Any] = {
        "a": str(run_a), "b": str(run_b),
        "env_changes": diff(env_a, env_b, _ENV_NOISE),
        "config_changes": diff({k: v for k, v in cfg_a.items() if k != "jobs"},
                               {k: v for k, v in cfg_b.items() if k != "jobs"}),
        "only_in_a": sorted(set(jobs_a) - set(jobs_b)), "only_in_b": sorted(set(jobs_b) - set(jobs_a)),
        "jobs": {}, "regressions": [],
    }
    for name in sorted(set(jobs_a) & set(jobs_b)):
        ja = evidence.read_json_or_none(run_a / name / RUN_FILES.job) or {}
        jb = evidence.read_json_or_none(run_b / name / RUN_FILES.job) or {}
        fa = job_figures(run_a, name, jobs_a[name], board_a.get(name, {}))
        fb = job_figures(run_b, name, jobs_b[name], board_b.get(name, {}))
        entry: dict[str, Any] = {
            "config_changes": diff(ja.get("config") or {}, jb.get("config") or {}),
            "placement": None if fa.gpus == fb.gpus else {"a": fa.gpus, "b": fb.gpus},
            "data": None if fa.dataset == fb.dataset else {"a": fa.dataset, "b": fb.dataset},
            "a": fa.__dict__, "b": fb.__dict__,
            "throughput_change": _change(fa.samples_per_s, fb.samples_per_s),
            "memory_change": _change(fa.peak_memory_gib, fb.peak_memory_gib),
            "metric_changes": {k: fb.metrics[k] - fa.metrics[k] for k in fa.metrics if k in fb.metrics},
            "score_change": (fb.score - fa.score) if fa.score is not None and fb.score is not None else None,
        }
        change = entry["throughput_change"]
        if change is not None and change < -regression:
            entry["regression"] = True
            out["regressions"].append(f"{name}: throughput {change:+.1%} ({fa.samples_per_s:.1f} -> "
                                      f"{fb.samples_per_s:.1f} samples/s)")
        out["jobs"][name] = entry
    return out


def render(report: dict[str, Any], console: Any) -> None:
    """Rich tables: what changed, then the figures per job."""
    from rich.table import Table
    from rich.text import Text

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:+.1%}"

    def num(v: float | None, fmt: str = ".1f") -> str:
        return "-" if v is None else format(v, fmt)

    changes = Table(title=Text(f"what changed: A={report['a']}  B={report['b']}"))  # paths: no markup
    for col in ("where", "key", "A", "B"):
        changes.add_column(col, overflow="fold")
    for c in report["env_changes"]:
        changes.add_row("env", Text(c["key"]), Text(str(c["a"])), Text(str(c["b"])))
    for c in report["config_changes"]:
        changes.add_row("fleet config", Text(c["key"]), Text(str(c["a"])), Text(str(c["b"])))
    for name, j in report["jobs"].items():
        for c in j["config_changes"]:
            changes.add_row(Text(f"job {name}"), Text(c["key"]), Text(str(c["a"])), Text(str(c["b"])))
        if j["placement"]:
            changes.add_row(Text(f"job {name}"), "placement (GPUs)", str(j["placement"]["a"]), str(j["placement"]["b"]))
        if j["data"]:
            changes.add_row(Text(f"job {name}"), "dataset version", Text(str(j["data"]["a"])), Text(str(j["data"]["b"])))
    for name in report["only_in_a"]:
        changes.add_row(Text(f"job {name}"), "only in A", "", "")
    for name in report["only_in_b"]:
        changes.add_row(Text(f"job {name}"), "only in B", "", "")
    if changes.row_count:
        console.print(changes)
    else:
        console.print(Text("nothing changed in config, environment, data or placement"))
    # One small table per job, a figure per row: four columns stay legible at 80 columns and under a pipe
    # (nine side by side wrapped each header letter by letter).
    for name, j in report["jobs"].items():
        a, b = j["a"], j["b"]
        figs = Table(title=Text(f"job {name}: how the figures moved (B against A)"), title_justify="left")
        for col, just in (("figure", "left"), ("A", "right"), ("B", "right"), ("B vs A", "right")):
            figs.add_column(col, justify=just, overflow="fold")
        figs.add_row("samples/s", num(a["samples_per_s"]), num(b["samples_per_s"]),
                     Text(pct(j["throughput_change"]), style="bold red" if j.get("regression") else ""))
        figs.add_row("peak GiB", num(a["peak_memory_gib"], ".2f"), num(b["peak_memory_gib"], ".2f"),
                     pct(j["memory_change"]))
        figs.add_row("score", num(a["score"], ".4f"), num(b["score"], ".4f"), num(j["score_change"], "+.4f"))
        for k, delta in j["metric_changes"].items():
            figs.add_row(Text(k), num(a["metrics"].get(k), ".4g"), num(b["metrics"].get(k), ".4g"),
                         num(delta, "+.4f"))
        console.print(figs)
    for line in report["regressions"]:
        console.print(Text(f"REGRESSION {line}", style="bold red"))
