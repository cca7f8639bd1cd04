"""The whole `musubi` command line in one place: every command, the module that holds it, its one-line help.

Each command group lives in its own module of musubi/cli (parse, call, print); the packages expose functions,
never CLI objects. Nothing heavy is imported until a command runs.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from typing import Any

import typer
from rich.text import Text
from typer.models import DefaultPlaceholder, OptionInfo

from musubi.cli.about import env_command, schema_command
from musubi.cli.check import check_command
from musubi.cli.data import data_app
from musubi.cli.evaluate import evaluate_command, export_command, leaderboard_command, registry_app
from musubi.cli.output import err_console
from musubi.cli.plan import plan_command
from musubi.cli.predict import predict_command
from musubi.cli.records import checklist_command, compare_command
from musubi.cli.recovery import drill_command, goodput_command
from musubi.cli.report import report_command
from musubi.cli.train import run, train

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Musubi: train a fleet of PyTorch models across many GPUs as one system.")

#: name -> (function, one-line help). Order is the order of `musubi --help`.
COMMANDS = {
    "train": (train, "Train one job on all GPUs of this machine (or N CPU ranks), or on several nodes."),
    "run": (run, "Train a whole fleet: pack jobs onto the GPUs, retry failures, then rank, export and register."),
    "check": (check_command, "Preflight: stack, GPUs, binding, NCCL bandwidth, disk, data, environment; exit 1 on "
              "any FAIL."),
    "plan": (plan_command, "Parallel layouts (TP/PP/DP/CP/EP/ZeRO): memory, step time, MFU; search or evaluate."),
    "report": (report_command, "Diagnose a run from its telemetry (label + evidence); write report.html and a "
               "Chrome/Perfetto trace."),
    "leaderboard": (leaderboard_command, "The fleet's ranking: quality, FPS, composite score (table or --json)."),
    "evaluate": (evaluate_command, "Evaluate one finished job: metrics and FPS by the documented protocol."),
    "export": (export_command, "Export a job's model: ONNX (checked against torch) or plain .pt weights."),
    "predict": (predict_command, "Run a job's checkpoint, an export or a registered model on images, a folder, a "
                "glob or a video: COCO results with class names."),
    "checklist": (checklist_command, "Check a run against its success criteria again (before / during / after); "
                  "exit 1 if it missed them."),
    "compare": (compare_command, "What changed between two runs (config, environment, data, placement) and how "
                "the figures moved."),
    "drill": (drill_command, "Train a job under injected faults (kill, hang, ckpt_kill): success rate, exact "
              "weights, recovery time, goodput."),
    "goodput": (goodput_command, "A job's effective training time ratio and the work lost per failure."),
    "schema": (schema_command, "Print every job YAML field with its type, default and meaning (markdown)."),
    "env": (env_command, "One block describing this machine and stack, to paste into a bug report."),
}
#: name -> (sub-app, one-line help naming every subcommand).
GROUPS = {
    "data": (data_app, "Data sets: check, hash, split, slice, convert, watch, synth."),
    "registry": (registry_app, "The model registry: list, register, promote, demote, manifest, rebuild."),
}

for _name, (_fn, _help) in COMMANDS.items():
    app.command(_name, help=_help)(_fn)
for _name, (_sub, _help) in GROUPS.items():
    app.add_typer(_sub, name=_name, help=_help)


def _no_type(option):  # noqa: ANN001, ANN202 - typer's help option (or None)
    if option is not None and option.metavar is None:
        option.metavar = ""  # shown as `--help`, not `--help <bool>`
    return option


class _Command(typer.core.TyperCommand):
    """A command whose --help shows no value type (it takes none)."""

    def get_help_option(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        return _no_type(super().get_help_option(ctx))


def usage_line(e: typer.TyperException) -> str:
    """A usage error as one line: what is wrong and where the usage is (`musubi train --help`)."""
    ctx = getattr(e, "ctx", None)
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    return f"{e.format_message()}{where}"


class _Group(typer.core.TyperGroup):
    """A command group whose --help shows no value type, and whose usage errors are one `error:` line like every
    other error (typer draws a boxed panel)."""

    def get_help_option(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        return _no_type(super().get_help_option(ctx))

    def get_params(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        # typer's --install-completion / --show-completion are flags too: no `<bool>` after them
        params = super().get_params(ctx)
        for p in params:
            if isinstance(p, typer.core.TyperOption) and p.is_flag and p.metavar is None:
                p.metavar = ""
        return params

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:  # noqa: ANN401 - click's signature
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as e:  # typer's click: usage errors, bad parameters
            if not standalone_mode:
                raise
            if e.__class__.__name__ != "NoArgsIsHelpError":  # the help was printed: nothing more to say
                err_console().print(Text("error: ", style="bold red") + Text(usage_line(e)), highlight=False)
            sys.exit(e.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            sys.exit(1)
        if not standalone_mode:
            return rv
        # typer returns an Exit's code when not standalone; a command's own return value is None.
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


def _flags_show_no_type(typer_app: typer.Typer) -> None:
    """Help lists `--resume`, not `--resume <bool>`: an on/off flag takes no value, so it shows no type."""
    if isinstance(typer_app.info.cls, DefaultPlaceholder) or typer_app.info.cls in (None, typer.core.TyperGroup):
        typer_app.info.cls = _Group
    callbacks = [typer_app.registered_callback.callback] if typer_app.registered_callback else []
    for cmd in typer_app.registered_commands:
        if cmd.cls in (None, typer.core.TyperCommand):
            cmd.cls = _Command
        callbacks.append(cmd.callback)
    for callback in callbacks:
        for param in inspect.signature(callback).parameters.values():
            info = param.default
            if isinstance(info, OptionInfo) and isinstance(info.default, bool) and info.metavar is None:
                info.metavar = ""
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _flags_show_no_type(group.typer_instance)


def _print_version(value: bool) -> None:
    if value:
        import musubi

        print(f"musubi {musubi.__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Musubi: train a fleet of PyTorch models across many GPUs as one system. Shell completion:
    `musubi --install-completion` (bash, zsh, fish, PowerShell), or `--show-completion` to print the script."""


_flags_show_no_type(app)


def main() -> None:  # pragma: no cover - console entry point
    """Entry point for `python -m musubi.cli`."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
