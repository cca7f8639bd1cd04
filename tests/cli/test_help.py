"""`musubi --version`, and help that shows no value type after flags that take no value."""

from __future__ import annotations

import click
import typer.main
from typer.testing import CliRunner

import musubi
from musubi.cli import app


def _paths(cmd: click.Command, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for name, sub in getattr(cmd, "commands", {}).items():
        out += _paths(sub, (*prefix, name))
    return out


def test_version() -> None:
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"musubi {musubi.__version__}"


def test_no_command_help_shows_bool_after_a_flag() -> None:
    """Every command and group: `--resume`, `--json`, `--help` listed without `<bool>`; real types still shown."""
    paths = _paths(typer.main.get_command(app))
    assert ("train",) in paths and ("registry", "list") in paths
    for path in paths:
        res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "120"})
        assert res.exit_code == 0, (path, res.output)
        assert "<bool>" not in res.output, (path, res.output)
    train = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "120"}).output
    assert "--resume" in train and "<int>" in train  # --nproc keeps its type
