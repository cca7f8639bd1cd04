"""The report page: one self-contained HTML file (inline SVG plots, inline CSS, no script, no network).

Every string that comes from a run directory (job names, preflight findings,
leaderboard cells, paths) passes through `esc` (html.escape, quotes included),
and the page's Content-Security-Policy forbids scripts and any fetch, so a
hostile name renders as text even if a future edit forgets an escape.
"""

from __future__ import annotations

import datetime as dt
import html
import json
from pathlib import Path
from typing import Any

from musubi.contract.run_files import RUN_FILES
from musubi.diagnose import figures
from musubi.diagnose.fleet_view import fleet_section
from musubi.diagnose.timeline import JobTelemetry
from musubi.records.evidence import metric_records
from musubi.store.rundir import read_jsonl
from musubi.telemetry.sections import SECTIONS

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{margin-top:2em;border-bottom:1px solid #ddd}h3{font-size:1.05em;margin-top:1.5em}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f5f5f5}.num{text-align:right;font-variant-numeric:tabular-nums}
.label{font-size:1.15em;font-weight:600;padding:.6em .9em;border-radius:6px;background:#eef5ff;margin:.5em 0}
.label.bad{background:#fff1e6}.pass{color:#2a7d2a}.warn{color:#a66a00}.fail{color:#b00020;font-weight:600}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}.muted{color:#777}
"""


def esc(value: Any) -> str:
    """HTML-escape anything (quotes too: safe in text and in attribute values)."""
    return html.escape(str(value), quote=True)


def _num(v: Any, digits: int = 1) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return esc("-" if v is None else v)
    return f"{v:,.{digits}f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """Cells are HTML already (escaped by the caller)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(svg: str | None, caption: str) -> str:
    if not figures.available():
        return f'<p class="muted">{esc(caption)}: not drawn (matplotlib is not installed).</p>'
    if not svg:
        return f'<p class="muted">{esc(caption)}: no data.</p>'
    return f'<figure class="plot">{svg}<figcaption class="muted">{esc(caption)}</figcaption></figure>'


def _diagnosis(a: dict[str, Any]) -> str:
    if not a.get("label"):
        return f'<p class="muted">{esc(a.get("text", "no telemetry"))}</p>'
    cls = "label" if a["label"] == "healthy compute bound" else "label bad"
    out = [f'<div class="{cls}" data-label="{esc(a["label"])}">{esc(a["text"])}</div>',
           f"<p>{esc(a['evidence'])}.</p>"]
    for lim in a.get("limitations") or []:
        out.append(f'<p class="muted" data-limitation="1"><b>Not measured:</b> {esc(lim)}.</p>')
    if a.get("findings"):
        out.append("<p>Also found:</p><ul>" + "".join(
            f"<li><b>{esc(f['text'])}</b>: {esc(f['evidence'])}</li>" for f in a["findings"]) + "</ul>")
    out.append(f'<p class="muted">{a["ranks"]} ranks on {esc(a["device"])}, steps {a["window"][0]}-{a["window"][1]} '
               f"analysed (warm-up excluded), median step {a['step_ms_median']:.2f} ms.</p>")
    return "".join(out)


def _breakdown_table(a: dict[str, Any]) -> str:
    b = a.get("breakdown") or {}
    cols = [s for s in SECTIONS if any(v["sections_ms"].get(s) for v in b.values())]
    rows = []
    for r in sorted(b, key=int):
        v = b[r]
        rows.append([f"rank {esc(r)}", *[f'<span class="num">{_num(v["sections_ms"].get(s, 0.0), 2)}</span>'
                                         for s in cols],
                     f'<span class="num">{_num(v["wall_ms"], 2)}</span>',
                     f'<span class="num">{_num(100 * (v["coverage_min"] or 0), 1)} %</span>'])
    return _table(["rank", *[f"{s} ms" for s in cols], "step ms", "span coverage (worst step)"], rows)


def _straggler_table(a: dict[str, Any]) -> str:
    s = a.get("stragglers") or {}
    rows = []
    for r in s.get("ranks", []):
        rows.append([f"rank {esc(r['rank'])}", f"{_num(100 * r['excess'], 1)} %", esc(r["section"]),
                     f"{_num(100 * r['work_excess'], 1)} %",
                     "-" if r["last_share"] is None else f"{_num(100 * r['last_share'], 0)} %",
                     "-" if r["history"] is None else f"{_num(r['history'], 3)}x",
                     "<b>yes</b>" if r["flagged"] else "no", esc(r.get("flagged_at") or "-"),
                     "-" if r.get("cv") is None else _num(r["cv"], 3),
                     "-" if r.get("p99_p50") is None else _num(r["p99_p50"], 3)])
    if not rows:
        return '<p class="muted">One rank: no straggler analysis.</p>'
    need = s.get("last_share_needed")
    return (_table(["rank", "excess vs others", "in section", "all pre-sync work", "arrived last", "vs own start",
                    "straggler",
                    "flagged live at step", "step-time CV", "p99/p50"], rows)
            + f'<p class="muted">Excess: median extra time over the other ranks (their median), over all '
              f'pre-sync work or in one section where larger, as a share of the step. Flag: excess &ge; '
              f'{_num(100 * s["threshold"], 1)} %, clearly above the step-to-step noise (sign test at '
              f'{_num(100 * s.get("alpha", 0.05), 0)} %: enough steps over the bar, not merely half), and last '
              f"arrival at the gradient all-reduce in &ge; {_num(100 * (need or 0), 0)} % of {s['steps']} steps (or "
              "flagged live and over the bar for a quarter of the run). Step-time CV and p99/p50: each rank's own step times after the warm-up steps (the right tail "
              "that CPU pinning aims to narrow).</p>")


def _hardware_table(a: dict[str, Any]) -> str:
    hw = (a.get("figures") or {}).get("hardware") or {}
    keys = [("util", "GPU util %"), ("sm_active", "SM active %"), ("power_w", "power W"), ("temp_c", "temp C"),
            ("sm_clock_mhz", "SM MHz"), ("mem_used_max", "memory used (max)"), ("proc_cpu", "process CPU %"),
            ("workers_cpu", "loader workers CPU %"), ("host_cpu", "host CPU %")]
    keys = [k for k in keys if any(k[0] in v for v in hw.values())]
    rows = []
    for r in sorted(hw, key=int):
        v = hw[r]
        rows.append([f"rank {esc(r)}", *[esc(_num(v.get(k))) for k, _ in keys],
                     esc(", ".join(v.get("throttle", [])) or "-")])
    return _table(["rank", *[h for _, h in keys], "throttle reasons"], rows) if rows else ""


def _leaderboard(run: Path) -> str:
    try:
        data = json.loads((run / RUN_FILES.leaderboard).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return ""
    cols = ["rank", "job", "model", "metric", "quality", "fps", "score", "reason"]
    body = [[esc(_num(r.get(c), 3)) if isinstance(r.get(c), float) else esc("-" if r.get(c) is None else r.get(c))
             for c in cols] for r in rows if isinstance(r, dict)]
    return "<h2>Leaderboard</h2>" + _table(cols, body) + (
        f'<p class="muted">{esc(data.get("formula", ""))}</p>' if data.get("formula") else "")


def _preflight(run: Path) -> str:
    try:
        data = json.loads((run / RUN_FILES.preflight).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        return ""
    rows = []
    for r in results:
        if not isinstance(r, dict):
            continue
        status = str(r.get("status", ""))
        cls = {"PASS": "pass", "WARN": "warn", "FAIL": "fail"}.get(status, "")
        rows.append([f'<span class="{cls}">{esc(status)}</span>', esc(r.get("check", "")), esc(r.get("found", "")),
                     esc(r.get("fix") or "")])
    return "<h2>Preflight</h2>" + _table(["status", "check", "found", "fix"], rows)


def _checklist(run: Path) -> str:
    """The run's checklist (RUN/checklist.json, written at the end of `musubi run`/`train`)."""
    try:
        data = json.loads((run / RUN_FILES.checklist).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    items = data.get("items") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return ""
    rows = []
    for i in items:
        if not isinstance(i, dict):
            continue
        status = str(i.get("status", ""))
        cls = {"PASS": "pass", "WARN": "warn", "FAIL": "fail"}.get(status, "muted")
        rows.append([esc(i.get("phase", "")), esc(i.get("job") or "-"), esc(i.get("check", "")),
                     f'<span class="{cls}">{esc(status)}</span>', esc(i.get("criterion") or ""),
                     esc(i.get("found", ""))])
    verdict = "met its success criteria" if data.get("ok") else "did NOT meet its success criteria"
    return (f"<h2>Checklist</h2><p>The run {esc(verdict)}. A threshold you wrote in <code>success:</code> is "
            "<em>yours</em> and fails the run when missed; a <em>default</em> one only warns.</p>"
            + _table(["phase", "job", "check", "status", "criterion", "found"], rows))


def _planner(job_dir: Path) -> str:
    """The planner's prediction for this job (JOB/plan.json) beside what the job measured."""
    from musubi.diagnose.planner_view import planner_view

    v = planner_view(job_dir)
    if "predicted" not in v:
        return f'<h3>Planner</h3><p class="muted">{esc(v["note"])}.</p>'
    pred, meas = v["predicted"], v["measured"]
    rows = []
    if "step_time_s" in pred:
        step = meas.get("step_time_s")
        rows.append(["step time (ms)", esc(_num(1e3 * pred["step_time_s"], 1)), esc(_num(1e3 * step, 1) if step else "-")])
    if "memory_allocated_gib" in pred:
        rows.append(["peak memory allocated (GiB)", esc(_num(pred["memory_allocated_gib"], 2)),
                     esc(_num(meas.get("memory_allocated_gib"), 2))])
    if "mfu" in pred:
        rows.append(["MFU (measured: achieved, see below)", esc(_num(pred["mfu"], 3)),
                     esc(_num(meas.get("mfu_achieved"), 3) if meas.get("mfu_achieved") else "-")])
    if not rows:
        return ""
    return ("<h3>Planner: predicted beside measured</h3>" + _table(["figure", "predicted", "measured"], rows)
            + f'<p class="muted">layout {esc(v.get("layout") or "")} on {esc(v.get("gpu") or "-")}; '
            "uncalibrated unless `musubi plan --calibrate` was used for the prediction. "
            + "".join(f"{esc(n)}." for n in v["notes"]) + "</p>")


def _reliability(job_dir: Path) -> str:
    """Goodput, each failure's cause and cost (JOB/goodput.json) and the checkpoints' blocked/durable times."""
    try:
        good = json.loads((job_dir / RUN_FILES.goodput).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        good = None
    saves = [r for r in read_jsonl(job_dir / RUN_FILES.metrics) if r.get("kind") == "checkpoint"] \
        if (job_dir / RUN_FILES.metrics).is_file() else []
    if not isinstance(good, dict) and not saves:
        return ""
    parts = ["<h3>Reliability: goodput, restarts, checkpoints</h3>"]
    if isinstance(good, dict):
        g, tg = good.get("goodput"), good.get("training_goodput")
        failures = [f for f in good.get("failures") or [] if isinstance(f, dict)]
        parts.append(f"<p>Goodput {esc(_num(100 * g, 1) + ' %' if isinstance(g, (int, float)) else 'n/a')} "
                     f"(productive {esc(_num(good.get('productive_s'), 1))} s of {esc(_num(good.get('wall_s'), 1))} s "
                     f"wall; {esc(_num(100 * tg, 1) + ' %' if isinstance(tg, (int, float)) else 'n/a')} from the "
                     f"first step on); {esc(good.get('attempts', 0))} attempt(s), {len(failures)} failure(s), "
                     f"{esc(good.get('lost_steps', 0))} step(s) lost, {esc(_num(good.get('downtime_s'), 1))} s "
                     "down.</p>")
        if failures:
            rows = [[esc(f.get("attempt")), esc(f.get("cause")), esc(", ".join(map(str, f.get("ranks") or [])) or "-"),
                     esc(f.get("failed_at_step")), esc("-" if f.get("resumed_from_step") is None
                                                       else f.get("resumed_from_step")),
                     esc(f.get("lost_steps")), esc(_num(f.get("lost_s"), 1)),
                     esc("-" if f.get("downtime_s") is None else _num(f.get("downtime_s"), 1)),
                     esc(str(f.get("detail") or "")[:200])] for f in failures]
            parts.append(_table(["attempt", "cause", "rank(s)", "failed at step", "resumed from", "steps lost",
                                 "s lost", "s down", "detail"], rows))
    if saves:
        rows = [[esc(r.get("step")), esc(r.get("mode", "")), esc(_num(r.get("blocked_s"), 3)),
                 esc(_num(r.get("durable_s"), 2)), esc("yes" if r.get("ok", True) else "no")] for r in saves[-10:]]
        blocked = [float(r["blocked_s"]) for r in saves if isinstance(r.get("blocked_s"), (int, float))]
        parts.append(f"<p>{len(saves)} checkpoint(s); the step was blocked at most "
                     f"{esc(_num(max(blocked), 3) if blocked else '-')} s"
                     + (" (the last 10 below)" if len(saves) > 10 else "") + ".</p>"
                     + _table(["step", "mode", "blocked (s)", "to durable (s)", "committed"], rows))
    return "".join(parts)


def _live_flags(tele: JobTelemetry) -> str:
    flags = [f for f in tele.flags if f.get("kind") == "straggler"]
    if not flags:
        return ""

    def cleared(f: dict[str, Any]) -> str:
        at = [c.get("step") for c in tele.flags if c.get("kind") == "cleared" and c.get("rank") == f.get("rank")
              and isinstance(c.get("step"), int) and c["step"] > int(f.get("step") or 0)]
        return f"; cleared at step {esc(min(at))}" if at else ""

    items = "".join(f"<li>step {esc(f.get('step'))}: rank {esc(f.get('rank'))} in {esc(f.get('section'))}, "
                    f"{_num(100 * float(f.get('excess', 0)), 1)} % of a step{cleared(f)}</li>" for f in flags)
    return f"<p>Flagged during the run:</p><ul>{items}</ul>"


def render(run: Path, jobs: list[tuple[JobTelemetry, dict[str, Any]]], trace_name: str | None) -> str:
    """The whole page."""
    parts = [f"<h1>Musubi report: {esc(run.name)}</h1>",
             f'<p class="muted">{esc(run)} &middot; written {esc(dt.datetime.now().isoformat(timespec="seconds"))}'
             + (f" &middot; spans as Chrome/Perfetto trace: {esc(trace_name)}" if trace_name else "") + "</p>",
             fleet_section(run)]
    for tele, a in jobs:
        parts.append(f'<h2 class="job">Job {esc(tele.name)}</h2>')
        parts.append("<h3>Diagnosis</h3>" + _diagnosis(a))
        parts.append("<h3>Training curves</h3>" + _figure(figures.curves(metric_records(tele.path)),
                                                          "Loss and validation metrics per step (metrics.jsonl; "
                                                          "the loss's parts where the task names them)"))
        parts.append(_figure(figures.utilisation(tele), "Utilisation over time, per GPU" if tele.on_gpu else
                             "CPU load over time, per rank (CPU ranks: no GPU)"))
        parts.append("<h3>Step-time breakdown per rank</h3>" + _figure(figures.breakdown(a), "Mean ms per step")
                     + (_breakdown_table(a) if a.get("breakdown") else ""))
        parts.append(_figure(figures.heartbeat(tele), "Stall heartbeat: every step's time"))
        parts.append("<h3>Stragglers</h3>" + _live_flags(tele) + (_straggler_table(a) if a.get("label") else "")
                     + _figure(figures.local_work(tele), "Per-rank work before the gradient sync"))
        parts.append(_figure(figures.memory(tele), "Memory over time"))
        hw = _hardware_table(a)
        if hw:
            parts.append("<h3>Hardware (means over the analysed steps)</h3>" + hw)
        parts.append(_planner(tele.path))
        parts.append(_reliability(tele.path))
    parts.append(_checklist(run))
    parts.append(_leaderboard(run))
    parts.append(_preflight(run))
    title = esc(f"Musubi report: {run.name}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{title}</title><style>{STYLE}</style></head><body>" + "\n".join(p for p in parts if p)
            + "</body></html>\n")


__all__ = ["render", "esc", "read_jsonl"]
