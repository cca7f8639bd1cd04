"""`musubi train` in process, and the one-line error contract its refusals keep."""

from __future__ import annotations

from typer.testing import CliRunner

from musubi.cli import app


def run(*args: str) -> tuple[int, str]:
    """`musubi train ARGS` through the CLI: (exit code, output)."""
    res = CliRunner().invoke(app, ["train", *args])
    return res.exit_code, res.output


def one_line_error(out: str) -> str:
    """The single `error: ...` line a refused command prints (asserts there is nothing else)."""
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), out
    return lines[0]
