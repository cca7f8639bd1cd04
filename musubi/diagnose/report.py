"""A run's diagnosis: every job analysed (label + evidence), the HTML page and the Chrome/Perfetto trace written
whole; `musubi report` (musubi/cli/report.py) prints it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError


def step_window(window: str | None) -> tuple[int | None, int | None]:
    """`--steps 100:400` -> (100, 400); either end may be left out."""
    if not window:
        return None, None
    a, sep, b = window.partition(":")
    try:
        first = int(a) if a.strip() else None
        last = int(b) if b.strip() else None
    except ValueError:
        raise ConfigError(f"--steps {window!r}: give FIRST:LAST optimizer steps, e.g. --steps 100:400") from None
    if not sep or (first is not None and last is not None and last < first):
        raise ConfigError(f"--steps {window!r}: give FIRST:LAST optimizer steps, e.g. --steps 100:400")
    return first, last


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def build_report(run: Path, out: Path | None = None, window: str | None = None,
                 write_html: bool = True, trace_steps: int | None = None) -> dict[str, Any]:
    """Analyse every job of `run`; write the HTML page and the trace unless `write_html` is False."""
    from musubi.diagnose.classify import analyze
    from musubi.diagnose.timeline import job_dirs, load_job

    run = Path(run)
    if not run.is_dir():
        raise ConfigError(f"{run}: no such run directory; give the --out folder of `musubi train` or `musubi run`")
    first, last = step_window(window)
    dirs = job_dirs(run)
    if not dirs:
        raise ConfigError(f"{run}: no job with a telemetry/ folder; was it trained with telemetry.enabled: false?")
    jobs = []
    for d in dirs:
        tele = load_job(d)
        jobs.append((tele, analyze(tele, first, last)))
    from musubi.diagnose.planner_view import planner_view

    for tele, a in jobs:
        a["planner"] = planner_view(tele.path)
    result: dict[str, Any] = {"run": str(run), "jobs": [a for _, a in jobs]}
    if write_html:
        from musubi.diagnose import figures
        from musubi.diagnose.page import render
        from musubi.diagnose.trace import MAX_STEPS, chrome_trace

        html_path = out or run / "report.html"
        trace_path = html_path.with_name(html_path.stem + ".trace.json")
        # Both are built before either is written, and each lands whole (written aside, then renamed):
        # a failure leaves no half-written report behind.
        # With --steps the plots, the tables and the trace show the same steps as the label.
        shown = [(t.window(first, last), a) for t, a in jobs]
        page = render(run, shown, trace_path.name)
        traced = chrome_trace([t for t, _ in shown], MAX_STEPS if trace_steps is None else trace_steps)
        trace = json.dumps(traced)
        html_path.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(trace_path, trace)
        _write_whole(html_path, page)
        result["html"], result["trace"] = str(html_path), str(trace_path)
        result["plots"] = figures.available()
        if traced.get("otherData"):
            result["trace_steps_left_out"] = traced["otherData"]["steps_left_out"]
    return result


def tail_line(analysis: dict) -> str | None:
    """'step-time tail, worst rank: CV 0.190 (rank 2), p99/p50 1.437 (rank 0)' from a job's straggler figures."""
    ranks = [r for r in ((analysis.get("stragglers") or {}).get("ranks") or []) if r.get("cv") is not None]
    if not ranks:
        return None
    cv = max(ranks, key=lambda r: r["cv"])
    tail = max((r for r in ranks if r.get("p99_p50") is not None), key=lambda r: r["p99_p50"], default=None)
    out = f"step-time tail after warm-up, worst rank: CV {cv['cv']:.3f} (rank {cv['rank']})"
    if tail is not None:
        out += f", p99/p50 {tail['p99_p50']:.3f} (rank {tail['rank']})"
    return out
