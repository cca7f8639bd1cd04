"""Recovery commands: `musubi drill` (a job under injected faults) and `musubi goodput` (a job's figures)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from musubi.cli.output import fail, out_console
from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED
from musubi.contract.run_files import RUN_FILES


def drill_command(
    job: Path = typer.Argument(..., help="Job YAML to drill."),
    faults: str = typer.Option("kill,hang,ckpt_kill", "--faults", help="Comma list of kill, hang, ckpt_kill."),
    repeat: int = typer.Option(3, "--repeat", help="Runs per fault, each with a random rank and step."),
    nproc: int | None = typer.Option(None, "--nproc", help="Ranks: default all visible GPUs, else 2 CPU ranks."),
    out: Path | None = typer.Option(None, "--out", help="Drill directory (default runs/<time>-drill-<name>)."),
    device: str | None = typer.Option(None, "--device", help="cuda or cpu (default: cuda if a GPU is visible)."),
    set_: list[str] = typer.Option([], "--set", help="Override a job field (repeatable)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the fault draws (the same seed draws the same faults)."),
    reference: Path | None = typer.Option(None, "--reference", help="A finished drill (or its reference/ folder) "
                                          "of the same job, world and stack: compare against its reference run "
                                          "instead of training one; refused if it differs or is damaged."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Train a job under injected faults; print success rate, exactness, recovery time and goodput."""
    from musubi.launch.drill import DrillRequest, parse_faults, run_drill

    console = out_console()
    try:
        req = DrillRequest(job_path=job, faults=parse_faults(faults), repeat=repeat, nproc=nproc, out=out,
                           device=device, overrides=list(set_), seed=seed, reference=reference)
        result = run_drill(req, progress=None if as_json else (lambda m: console.print(m, highlight=False)))
    except ConfigError as e:
        fail(str(e), EXIT_CONFIG)
    except KeyboardInterrupt:  # the running drill's torchrun was stopped; its runs so far stay in --out
        fail(f"drill interrupted: the running job was stopped; finished runs are in {out}", EXIT_INTERRUPTED)
    if as_json:
        print(json.dumps(result["summary"], indent=1))
    else:
        t = Table(title=f"drill of {job.name}: {result['nproc']} ranks, {result['total_steps']} steps")
        for col in ("fault", "runs", "success", "weights equal", "recovery s (median/max)", "goodput",
                    "goodput from 1st step", "lost steps", "check"):
            t.add_column(col)
        for kind, f in result["summary"].items():
            check = ""
            if kind == "ckpt_kill":
                check = f"partial loads {f['partial_loads']}"
            elif kind == "hang":
                check = (f"named {f['named']}/{f['runs']}, detected <= {f['detected_after_s_max']}s "
                         f"(timeout {f['timeout_s']}s)")
            t.add_row(kind, str(f["runs"]), f"{f['success_rate']:.0%}", f"{f['weights_equal']}/{f['runs']}",
                      f"{f['recovery_s_median']}/{f['recovery_s_max']}", _pct(f["goodput_mean"]),
                      _pct(f["training_goodput_mean"]), str(f["lost_steps_mean"]), check)
        console.print(t)
        console.print(f"details: {Path(result['out']) / 'drill.json'}", highlight=False)
    if any(f["success_rate"] < 1 for f in result["summary"].values()):
        raise typer.Exit(EXIT_FAILED)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def goodput_command(
    job_dir: Path = typer.Argument(..., help="A job directory (RUN/JOB) or a one-job run directory."),
    as_json: bool = typer.Option(False, "--json", help="Print goodput.json."),
) -> None:
    """Effective training time ratio and the work lost per failure, from the job's restart history."""
    from musubi.recovery.goodput import goodput_line, write_goodput

    if not (job_dir / RUN_FILES.progress).is_dir():
        subs = [p for p in job_dir.iterdir() if (p / RUN_FILES.progress).is_dir()] if job_dir.is_dir() else []
        if len(subs) != 1:
            fail(f"{job_dir}: no job directory with progress records; give RUN/JOB", EXIT_CONFIG)
        job_dir = subs[0]
    rec = write_goodput(job_dir)
    assert rec is not None
    if as_json:
        print(json.dumps(rec, indent=1))
        return
    print(goodput_line(rec))
    for f in rec["failures"]:
        if f["resumed_from_step"] is None:  # the failure that ended the job: no attempt came after it
            print(f"  attempt {f['attempt']}: {f['detail']}; step {f['failed_at_step']}, then the job ended "
                  f"(restarts ran out or the error will not go away): {f['lost_steps']} step(s) since the last "
                  f"committed checkpoint, {f['lost_s']:.1f}s of work")
            continue
        down = f"{f['downtime_s']:.1f}s" if f["downtime_s"] is not None else "n/a (next launch)"
        print(f"  attempt {f['attempt']}: {f['detail']}; step {f['failed_at_step']} -> resumed from "
              f"{f['resumed_from_step']}: {f['lost_steps']} step(s), {f['lost_s']:.1f}s of work lost, {down} down")
