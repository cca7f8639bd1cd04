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
from musubi.contract.exits import EXIT_FAILED, EXIT_OK

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Musubi: train a fleet of PyTorch models across many GPUs as one system.")

# The whole command line, in the order of `musubi --help`: name, one-line help, the function (its module above).
app.command("train", help="Train one job on all GPUs of this machine (or N CPU ranks), or on several nodes.")(
    train)
app.command("run", help="Train a whole fleet: pack jobs onto the GPUs, retry failures, then rank, export and "
            "register.")(run)
app.command("check", help="Preflight: stack, GPUs, binding, NCCL bandwidth, disk, data, environment; exit 1 on any "
            "FAIL.")(check_command)
app.command("plan", help="Parallel layouts (TP/PP/DP/CP/EP/ZeRO): memory, step time, MFU; search or evaluate.")(
    plan_command)
app.command("report", help="Diagnose a run from its telemetry (label + evidence); write report.html and a "
            "Chrome/Perfetto trace.")(report_command)
app.command("leaderboard", help="The fleet's ranking: quality, FPS, composite score (table or --json).")(
    leaderboard_command)
app.command("evaluate", help="Evaluate one finished job: metrics and FPS by the documented protocol.")(
    evaluate_command)
app.command("export", help="Export a job's model: ONNX (checked against torch) or plain .pt weights.")(
    export_command)
app.command("predict", help="Run a job's checkpoint, an export or a registered model on images, a folder, a glob "
            "or a video: COCO results with class names.")(predict_command)
app.command("checklist", help="Check a run against its success criteria again (before / during / after); exit 1 "
            "if it missed them.")(checklist_command)
app.command("compare", help="What changed between two runs (config, environment, data, placement) and how the "
            "figures moved.")(compare_command)
app.command("drill", help="Train a job under injected faults (kill, hang, ckpt_kill): success rate, exact weights, "
            "recovery time, goodput.")(drill_command)
app.command("goodput", help="A job's effective training time ratio and the work lost per failure.")(goodput_command)
app.command("schema", help="Print every job YAML field with its type, default and meaning (markdown).")(
    schema_command)
app.command("env", help="One block describing this machine and stack, to paste into a bug report.")(env_command)
app.add_typer(data_app, name="data", help="Data sets: check, hash, split, slice, convert, watch, synth.")
app.add_typer(registry_app, name="registry", help="The model registry: list, register, promote, demote, manifest, "
              "rebuild.")


def _no_type(option):  # noqa: ANN001, ANN202 - typer's help option (or None)
    if option is not None and option.metavar is None:
        option.metavar = ""  # shown as `--help`, not `--help <bool>`
    return option


def _flags_untyped(params: list[Any]) -> list[Any]:
    """On/off flags take no value, so their help shows no `<bool>`."""
    for p in params:
        if isinstance(p, typer.core.TyperOption) and p.is_flag and p.metavar is None:
            p.metavar = ""
    return params


class _Command(typer.core.TyperCommand):
    """A command whose --help shows no value type after a flag (it takes none)."""

    def get_help_option(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        return _no_type(super().get_help_option(ctx))

    def get_params(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        return _flags_untyped(super().get_params(ctx))


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
        return _flags_untyped(super().get_params(ctx))  # typer's --install-completion is a flag too

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
            sys.exit(EXIT_FAILED)
        if not standalone_mode:
            return rv
        # typer returns an Exit's code when not standalone; a command's own return value is None.
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else EXIT_OK)


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
