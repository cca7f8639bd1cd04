"""`musubi check`: run the preflight, print one line per result (or JSON), exit 1 if any check failed."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from musubi.cli.output import fail
from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_FAILED
from musubi.contract.run_files import RUN_FILES


def check_command(
    gpus: str | None = typer.Option(
        None, "--gpus", help="How many GPUs to check: the first N visible (a count, as in `musubi run` and "
        "`musubi plan`). Default: every visible GPU (CPU ranks on gloo if there is none); missing GPUs fail."),
    gpu_ids: str | None = typer.Option(
        None, "--gpu-ids", help="Which GPUs to check, as nvidia-smi numbers them: 0,1,2,3."),
    data: list[str] = typer.Option(
        [], "--data", help="Dataset to check (repeatable): ANN.json or IMAGES_DIR::ANN.json (COCO), an image "
        "folder (ROOT/CLASS/img), or a text file. The first is the training split."),
    out: Path | None = typer.Option(
        None, "--out", help="Run directory: free space is checked there and RUN/preflight.json written."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (what preflight.json holds)."),
    no_comm: bool = typer.Option(False, "--no-comm", help="Skip the timed all-reduce."),
    ckpt_gib: float | None = typer.Option(
        None, "--ckpt-gib", min=0, help="Size of one checkpoint in GiB, to check free space at --out."),
    keep: int = typer.Option(3, "--keep", min=1, help="Checkpoints the run keeps (checkpoint.keep_last)."),
) -> None:
    """Check this machine before a run: stack, GPUs, binding, all-reduce, disk, data, environment."""
    from musubi.preflight.gpu_list import gpu_selection
    from musubi.preflight.result import render
    from musubi.preflight.runner import run_checks
    from musubi.store.rundir import write_json

    try:
        wanted = gpu_selection(gpus, gpu_ids)
    except ConfigError as e:
        fail(str(e))
    ckpt_bytes = int(ckpt_gib * 2**30) if ckpt_gib is not None else None
    report = run_checks(wanted, list(data), out, ckpt_bytes, comm=not no_comm, keep_checkpoints=keep)
    if out is not None:
        try:
            write_json(out / RUN_FILES.preflight, report.to_dict())
        except OSError as e:  # an unwritable --out is already a FAIL line of the report
            Console(stderr=True, soft_wrap=True).print(f"error: cannot write {out / RUN_FILES.preflight}: {e}",
                                                       highlight=False, markup=False)
    if as_json:
        print(report.to_json())
    else:
        render(report, Console(soft_wrap=True))
    if report.failed:
        raise typer.Exit(EXIT_FAILED)
