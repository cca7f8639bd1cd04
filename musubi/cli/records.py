"""`musubi checklist` and `musubi compare`: a run's evidence against its criteria, and what changed between two runs."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from musubi.cli.output import fail
from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG, EXIT_FAILED


def checklist_command(
    run_dir: Path = typer.Argument(..., help="Run directory of `musubi run` or `musubi train` (or one job's "
                                   "folder, RUN/JOB: its items only)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (what RUN/checklist.json holds)."),
) -> None:
    """Check a run against its success criteria again (before / during / after); exit 1 if it missed them."""
    from musubi.records import checklist

    if not run_dir.is_dir():
        fail(f"{run_dir}: no such run directory; give the --out of a `musubi run` or `musubi train`", EXIT_CONFIG)
    run_dir, job = checklist.checklist_target(run_dir)
    cl = checklist.build_checklist(run_dir)
    if not cl.items or not any(i.job for i in cl.items):
        fail(f"{run_dir}: no job found (no fleet.json and no JOB/job.json); is this a run directory?", EXIT_CONFIG)
    checklist.write_checklist(run_dir, cl)  # always the whole run's: RUN/checklist.json
    if job is not None:
        cl = checklist.job_view(cl, job)
    if as_json:
        print(checklist.checklist_json(cl))
    else:
        checklist.render(cl, Console())
    if not cl.ok:
        raise typer.Exit(EXIT_FAILED)


def compare_command(
    run_a: Path = typer.Argument(..., help="The earlier run directory (A)."),
    run_b: Path = typer.Argument(..., help="The later run directory (B)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    threshold: float = typer.Option(0.10, "--regression", min=0.0, max=1.0,
                                    help="Throughput drop of B against A flagged as a regression."),
) -> None:
    """What changed between two runs (config, environment, data, placement) and how the figures moved."""
    from musubi.records.compare import compare_runs, render

    try:
        report = compare_runs(run_a, run_b, threshold)
    except ConfigError as e:
        fail(str(e), EXIT_CONFIG)
    if as_json:
        print(json.dumps(report, indent=1, default=str))
    else:
        render(report, Console())
