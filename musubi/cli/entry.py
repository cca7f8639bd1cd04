"""The `musubi` script's entry: the typer app, then an exit that skips the interpreter's teardown of torch.

A command that imported torch (train, run, evaluate, export, ...) spent 1-2 s after its last line tearing down
torch's modules and objects on 2 busy cores (measured: 1.1-2.3 s after `musubi train` printed its run folder;
a rank or a spare already ends with os._exit for the same reason). Nothing is left to do by then but what the
interpreter would do at exit: flush the streams and run the atexit handlers (logging's shutdown, temporary
folders' finalizers, multiprocessing's). Those run here; then the process ends with the command's exit code.
When another thread is still alive (the interpreter would wait for a non-daemon one) or torch was never
imported (nothing slow to skip), the exit is the interpreter's own.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

from musubi.cli.app import app


def main() -> None:
    """Run the command line; end the process as quickly as the interpreter would end it correctly."""
    try:
        app()
    except SystemExit as e:
        if isinstance(e.code, int | None) and fast_exit_safe():
            fast_exit(e.code or 0)
        raise


def fast_exit_safe() -> bool:
    """Whether skipping the teardown loses nothing: this thread alone, and torch imported (else nothing to skip)."""
    return threading.active_count() == 1 and "torch" in sys.modules


def fast_exit(code: int) -> None:
    """What the interpreter's exit does that matters (atexit handlers, flushed streams), then os._exit(code)."""
    atexit._run_exitfuncs()  # logging.shutdown, weakref finalizers (temporary folders), multiprocessing's
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: the interpreter would not report it either
            pass
    os._exit(code)
