"""How every command speaks: one `error: ...` line a problem (red on a terminal, plain text in a pipe), tables
as wide as their cells under a pipe, and the exit codes (2 bad input, 1 a failed check or run).

Every string that came from the user or a run directory is printed as plain text (no rich markup), so a
job named `[red]x` shows as written.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED

#: Width of a table printed into a pipe or a file: rich's 80 columns would cut cells (`0.56…`).
PIPE_WIDTH = 200


def err_console() -> Console:
    """stderr, for errors and notes (stdout stays clean for --json)."""
    return Console(stderr=True, soft_wrap=True)


def out_console() -> Console:
    """stdout: the terminal's width, or PIPE_WIDTH columns under a pipe (tables keep their cells whole)."""
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def fail(message: str, code: int = EXIT_CONFIG) -> NoReturn:
    """Print `error: MESSAGE` (one line per line of the message: a fleet's several problems) and exit."""
    con = err_console()
    for line in str(message).splitlines() or [""]:
        con.print(Text("error: ", style="bold red") + Text(line), highlight=False)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print `warning: MESSAGE` on stderr."""
    err_console().print(Text("warning: ", style="yellow") + Text(message), highlight=False)


def guarded(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn`; bad input exits 2 with its line, a failed preflight exits 1."""
    from musubi.launch.request import PreflightFailed

    try:
        return fn(*args)
    except ConfigError as e:
        fail(str(e), EXIT_CONFIG)
    except PreflightFailed as e:
        fail(str(e), EXIT_FAILED)
    except KeyboardInterrupt:  # launch_train stopped torchrun and recorded the attempt
        fail("interrupted: the ranks were stopped; continue with --resume and the same --out", EXIT_INTERRUPTED)
