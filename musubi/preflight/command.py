"""`musubi check`: run the preflight, print one line per result (or JSON), exit 1 if any check failed.

Registered by the CLI as `app.command("check")(check_command)`; nothing heavy is
imported until the command runs.
"""

from __future__ import annotations

from pathlib import Path

import typer

from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def parse_gpus(text: str) -> list[int]:
    """'0,1,3' -> [0, 1, 3]; ConfigError naming the bad entry otherwise."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ConfigError(f"--gpus {text!r}: {part!r} is not a GPU number; give nvidia-smi numbers like 0,1,2,3")
        out.append(int(part))
    return out


def check_command(
    gpus: str | None = typer.Option(
        None, "--gpus", help="GPUs to check, as nvidia-smi numbers them: 0,1,2,3. Default: every visible GPU "
        "(CPU ranks on gloo if there is none); with --gpus, missing GPUs fail."),
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
    from rich.console import Console

    from musubi.preflight.result import render
    from musubi.preflight.runner import run_checks
    from musubi.store.rundir import write_json

    try:
        wanted = parse_gpus(gpus) if gpus is not None else None
    except ConfigError as e:
        Console(stderr=True, soft_wrap=True).print(f"error: {e}", highlight=False, markup=False)
        raise typer.Exit(EXIT_USAGE) from None
    ckpt_bytes = int(ckpt_gib * 2**30) if ckpt_gib is not None else None
    report = run_checks(wanted, list(data), out, ckpt_bytes, comm=not no_comm, keep_checkpoints=keep)
    if out is not None:
        try:
            write_json(out / RUN_FILES.preflight, report.to_dict())
        except OSError as e:  # an unwritable --out is already a FAIL line of the report
            Console(stderr=True, soft_wrap=True).print(f"error: cannot write {out / 'preflight.json'}: {e}",
                                                       highlight=False, markup=False)
    if as_json:
        print(report.to_json())
    else:
        render(report, Console(soft_wrap=True))
    if report.failed:
        raise typer.Exit(EXIT_FAILED)
