"""`musubi report RUN [--html report.html] [--json] [--steps A:B]`: diagnosis, HTML report, Chrome trace."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from musubi.cli.output import fail, warn
from musubi.contract.errors import ConfigError
from musubi.diagnose.report import build_report, tail_line


def report_command(
    run: Path = typer.Argument(..., help="Run directory (or one job's folder)."),
    html: Path | None = typer.Option(None, "--html", "-o", help="HTML file (default RUN/report.html); the trace "
                                     "lands beside it."),
    out: Path | None = typer.Option(None, "--out", hidden=True, help="Deprecated spelling of --html (elsewhere "
                                    "--out names a run directory)."),
    as_json: bool = typer.Option(False, "--json", help="Print labels, evidence and figures as JSON (no HTML)."),
    steps: str | None = typer.Option(None, "--steps", help="Analyse optimizer steps FIRST:LAST only."),
    trace_steps: int = typer.Option(2000, "--trace-steps", min=0,
                                    help="At most this many steps per job in the trace (slowest, first, last); 0: all."),
) -> None:
    """Name each job's bottleneck with its evidence; write report.html and a Chrome/Perfetto trace."""
    if out is not None:
        # `--out` is a run directory for train and run; here it was the HTML file. Kept working, said once.
        warn(f"`musubi report --out FILE` is deprecated: use --html {out} (or -o); --out names a run "
             "directory in `musubi train` and `musubi run`")
        html = html or out
    try:
        result = build_report(run, html, steps, write_html=not as_json, trace_steps=trace_steps)
    except ConfigError as e:
        fail(str(e))
    if as_json:
        print(json.dumps(result, indent=1))
        return
    con = Console(soft_wrap=True)
    for a in result["jobs"]:
        if a.get("label"):
            con.print(f"{a['job']}: {a['text']} - {a['evidence']}", highlight=False, markup=False)
            for lim in a.get("limitations") or []:
                con.print(f"  not measured: {lim}", highlight=False, markup=False)
        else:
            con.print(f"{a['job']}: {a.get('text')}", highlight=False, markup=False)
        line = tail_line(a)
        if line:
            con.print(f"{a['job']}: {line}", highlight=False, markup=False)
    if not result.get("plots", True):
        con.print("plots left out: matplotlib is not installed (pip install 'musubi-train[report]')",
                  highlight=False, markup=False)
    for job, n in (result.get("trace_steps_left_out") or {}).items():
        con.print(f"trace: {n} steps of {job} left out (--trace-steps 0 keeps all)", highlight=False, markup=False)
    con.print(f"report: {result['html']}\ntrace: {result['trace']} (open in ui.perfetto.dev)", highlight=False)
