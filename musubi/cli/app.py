"""The `musubi` command line (typer + rich): parse, call, print. No logic lives here."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Musubi: train a fleet of PyTorch models across many GPUs as one system.")
err_console = Console(stderr=True, soft_wrap=True)


def _fail(message: str, code: int) -> None:
    # The message quotes user input (paths, names, values): escaped, so `[red]x` prints as written.
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True)
    raise typer.Exit(code)


def _guarded(fn, *args):  # noqa: ANN001, ANN202 - a thin wrapper of the two launching commands
    """Call `fn`; bad input exits 2 with one line, a failed preflight exits 1."""
    from musubi.launch.launch import PreflightFailed

    try:
        return fn(*args)
    except ConfigError as e:
        _fail(str(e), 2)
    except PreflightFailed as e:
        _fail(str(e), 1)
    except KeyboardInterrupt:  # launch_train stopped torchrun and recorded the attempt
        _fail("interrupted: the ranks were stopped; continue with --resume and the same --out", 130)


@app.command()
def train(
    job: Path = typer.Argument(..., help="Job YAML (see examples/)."),
    nproc: int | None = typer.Option(None, "--nproc", help="Ranks: default all visible GPUs, else 2 CPU ranks."),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default runs/<time>-<name>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest committed checkpoint."),
    max_steps: int | None = typer.Option(
        None, "--max-steps", help="Stop (and checkpoint) after this global optimizer step; the LR schedule "
        "is unchanged, so a later --resume continues exactly."),
    set_: list[str] = typer.Option([], "--set", help="Override a job field: --set train.batch=32 (repeatable)."),
    device: str | None = typer.Option(None, "--device", help="cuda or cpu (default: cuda if a GPU is visible)."),
    probe_only: bool = typer.Option(False, "--probe-only", help="With batch: auto, probe (or read the cache), "
                                    "print the agreed batch as JSON and exit."),
    no_check: bool = typer.Option(False, "--no-check", help="Skip the preflight (job.json records that)."),
    fleet_member: bool = typer.Option(False, "--fleet-member", hidden=True,
                                      help="Started by `musubi run`: RUN/ is the fleet's, only RUN/JOB/ is ours."),
    nnodes: int = typer.Option(1, "--nnodes", help="Nodes of the job: run `musubi train` with the same arguments "
                               "on each (c10d rendezvous; --nproc is per node)."),
    node_rank: int = typer.Option(0, "--node-rank", help="This node's rank, 0..nnodes-1 (0 hosts the rendezvous)."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of node 0's rendezvous "
                                             "store (multi-node)."),
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", help="Rendezvous id (default: job name + run dir)."),
    rdzv_timeout: int = typer.Option(300, "--rdzv-timeout", help="Seconds to wait for every node to join."),
    iface: str | None = typer.Option(None, "--iface", help="Network interface of the rendezvous and gloo/NCCL "
                                     "sockets (default: the one that routes to the endpoint)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the job and print the plan (ranks, batches, "
                                 "LR and why, data, output); start and write nothing."),
    oversubscribe: bool = typer.Option(False, "--oversubscribe", help="Allow more CPU ranks than cores (they "
                                       "share cores and run slower)."),
    allow_changes: list[str] = typer.Option([], "--allow-changes", help="With --resume: job fields that may "
                                            "differ from the recorded job, e.g. train.lr,data (job.json records "
                                            "the change)."),
) -> None:
    """Train one job on all GPUs of this machine (or N CPU ranks), or on several nodes, through torchrun."""
    entered = time.time()  # Python started and the CLI imported: the launcher's first start-up part ends here
    from musubi.launch.launch import TrainRequest, dry_run_plan, launch_train

    if max_steps is not None and max_steps < 1:
        _fail(f"--max-steps {max_steps}: must be >= 1", 2)
    if allow_changes and not resume:
        _fail("--allow-changes goes with --resume (a new run records whatever job it is given)", 2)
    say = None if probe_only else (lambda line: Console(soft_wrap=True).print(escape(line), highlight=False))
    req = TrainRequest(job_path=job, nproc=nproc, out=out, resume=resume, max_steps=max_steps,
                       overrides=list(set_), device=device, argv=sys.argv, probe_only=probe_only, check=not no_check,
                       fleet_member=fleet_member, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                       rdzv_id=rdzv_id, rdzv_timeout_s=rdzv_timeout, iface=iface, oversubscribe=oversubscribe,
                       allow_changes=list(allow_changes), say=say, marks={"entered": entered})
    if dry_run:
        for line in _guarded(dry_run_plan, req):
            print(line)
        print("dry run: nothing started, nothing written")
        return
    result = _guarded(launch_train, req)
    if result.already_finished:
        Console(soft_wrap=True).print(escape(result.error or ""), highlight=False)
        return
    if result.code != 0:
        _fail(f"{result.error} (logs: {result.job_dir / 'logs'})", result.code)
    if probe_only or node_rank > 0:  # node 0 reports the run
        return
    _print_goodput(result.job_dir)
    if not fleet_member and not _checklist(result.run_dir, Console()):
        _fail(f"the run did not meet its success criteria (see {result.run_dir / 'checklist.json'})", 1)
    Console().print(f"[green]run directory:[/] {escape(str(result.run_dir))}", highlight=False)


def _checklist(run_dir: Path, console: Console) -> bool:
    """Build, write and print the run's checklist; True when it met its criteria."""
    from musubi.records.checklist import build_checklist, render, write_checklist

    cl = build_checklist(run_dir)
    write_checklist(run_dir, cl)
    render(cl, console)
    return cl.ok


def _print_goodput(job_dir: Path) -> None:
    """After a run that restarted: the goodput line (what the failures cost)."""
    from musubi.recovery.goodput import goodput_line

    path = job_dir / RUN_FILES.goodput
    if path.is_file():
        rec = json.loads(path.read_text(encoding="utf-8"))
        if rec.get("failures"):
            Console().print(goodput_line(rec), highlight=False)


@app.command()
def run(
    fleet: Path = typer.Argument(..., help="Fleet YAML (see examples/fleet-demo.yaml)."),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default runs/<time>-<name>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue a fleet: skip finished jobs, resume the rest."),
    executor: str | None = typer.Option(None, "--executor", help="local (this machine's GPUs, the default) or "
                                        "slurm (each job a Slurm job); --resume keeps the run's own."),
    cpu_slots: int | None = typer.Option(None, "--cpu-slots", help="Without GPUs: CPU rank slots (default 2)."),
    device: str | None = typer.Option(None, "--device", help="cuda or cpu (default: cuda if a GPU is visible)."),
    no_check: bool = typer.Option(False, "--no-check", help="Skip the preflight (recorded)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print where each job would run and why (placements, "
                                 "cores), on this machine or machine.topology; start and write nothing."),
    gpus: int | None = typer.Option(None, "--gpus", min=1, max=1024, help="With --dry-run: plan for a machine of "
                                    "this many GPUs instead of this one (declared or fallback durations)."),
    replay: Path | None = typer.Option(None, "--replay", help="With --dry-run: replay RUN_DIR/fleet.json (a "
                                       "recorded run of this fleet) on the packer with its measured durations and "
                                       "compare the makespans."),
) -> None:
    """Train a whole fleet: pack jobs onto the GPUs, retry failures, then rank, export and register."""
    entered = time.time()  # Python started and the CLI imported: the fleet's first start-up part ends here
    from musubi.fleet.run import FleetRequest, note_finish, plan_fleet, run_fleet
    from musubi.fleet.stop import FleetInterrupted

    req = FleetRequest(fleet_path=fleet, out=out, resume=resume, executor=executor, cpu_slots=cpu_slots,
                       check=not no_check, device=device, dry_run=dry_run, gpus=gpus, replay=replay,
                       marks={"entered": entered})
    if replay is not None and not dry_run:
        _fail("--replay RUN_DIR simulates a recorded run: it goes with --dry-run", 2)
    if gpus is not None and not dry_run:
        _fail("--gpus N plans a machine of N GPUs: it goes with --dry-run (a real run uses the visible GPUs)", 2)
    if dry_run:
        _guarded(plan_fleet, req, Console(width=None if sys.stdout.isatty() else 160))
        return
    # Under a pipe (CI, a log file) rich would squeeze the live table into 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        run_dir, states = _guarded(run_fleet, req, console)
    except FleetInterrupted as e:
        _fail(f"{e}: the running jobs were stopped and recorded as interrupted; continue with "
              f"`musubi run {fleet} --out {e.run_dir} --resume`", e.code)
    t0 = time.perf_counter()
    met = _checklist(run_dir, console)
    # The end phase in fleet.json (bench/fleet.py: the time after the last job, split).
    note_finish(run_dir, checklist_s=round(time.perf_counter() - t0, 3), checked_at=round(time.time(), 3))
    failed = [s.name for s in states.values() if s.state != "done"]
    if failed:
        _fail(f"{len(failed)} job(s) failed: {', '.join(failed)} (causes in {run_dir / 'fleet.json'})", 1)
    if not met:
        _fail(f"the fleet did not meet its success criteria (see {run_dir / 'checklist.json'})", 1)
    Console().print(f"[green]run directory:[/] {escape(str(run_dir))}", highlight=False)


@app.command()
def checklist(
    run_dir: Path = typer.Argument(..., help="Run directory of `musubi run` or `musubi train` (or one job's "
                                   "folder, RUN/JOB: its items only)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (what RUN/checklist.json holds)."),
) -> None:
    """Check a run against its success criteria again (before / during / after); exit 1 if it missed them."""
    from musubi.records import checklist as C

    if not run_dir.is_dir():
        _fail(f"{run_dir}: no such run directory; give the --out of a `musubi run` or `musubi train`", 2)
    run_dir, job = C.checklist_target(run_dir)
    cl = C.build_checklist(run_dir)
    if not cl.items or not any(i.job for i in cl.items):
        _fail(f"{run_dir}: no job found (no fleet.json and no JOB/job.json); is this a run directory?", 2)
    C.write_checklist(run_dir, cl)  # always the whole run's: RUN/checklist.json
    if job is not None:
        cl = C.job_view(cl, job)
    if as_json:
        print(C.checklist_json(cl))
    else:
        C.render(cl, Console())
    if not cl.ok:
        raise typer.Exit(1)


@app.command()
def compare(
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
        _fail(str(e), 2)
    if as_json:
        print(json.dumps(report, indent=1, default=str))
    else:
        render(report, Console())


@app.command()
def schema() -> None:
    """Print every job YAML field with its type, default and meaning (markdown)."""
    from musubi.config.schema_doc import schema_markdown

    print(schema_markdown())


@app.command()
def env(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """One block describing this machine and stack, to paste into a bug report."""
    from musubi.store.rundir import env_record

    rec = env_record()
    if as_json:
        print(json.dumps(rec, indent=1))
        return
    import musubi

    print(f"musubi {musubi.__version__}")
    for k, v in rec.items():
        if k == "musubi":  # the first line says it
            continue
        if k == "packages":
            print("packages:")
            width = max((len(name) for name in v), default=0)
            for name, version in v.items():
                print(f"  {name:<{width}}  {version}")
        elif k == "project":
            print("project: " + (f"{v['root']} at {(v['commit'] or '')[:12]} ({v['branch']}"
                                 f"{', ' + str(v['changed_files']) + ' changed file(s)' if v['dirty'] else ''})"
                                 if v else "(the working directory is not in a git repository)"))
        elif k == "gpus":
            if not v:
                print("gpus: none visible (CPU ranks on gloo)")
            for g in v:
                print(f"gpu{g['index']}: {g['name']} {g['memory_gib']} GiB driver {g['driver']} {g['uuid']}")
        elif k == "topology":
            from musubi.topology import NodeTopology

            print("topology: " + NodeTopology.from_dict(v).summary())
        elif k == "env":
            print("env: " + (" ".join(f"{name}={value}" for name, value in v.items()) or "(no training variables set)"))
        else:
            print(f"{k}: {v}")


def _register_optional_commands() -> None:
    """Commands owned by their packages (thin wrappers live there; logic never here)."""
    from musubi.cli.data import data_app
    from musubi.cli.predict import predict_command
    from musubi.diagnose.command import report_command
    from musubi.evaluate.commands import evaluate_command, export_command, leaderboard_command, registry_app
    from musubi.launch.commands import drill_command, goodput_command
    from musubi.plan.command import plan_command
    from musubi.preflight.command import check_command

    app.command("leaderboard", help="The fleet's ranking: quality, FPS, composite score (table or --json).")(
        leaderboard_command)
    app.command("export", help="Export a job's model: ONNX (checked against torch) or plain .pt weights.")(
        export_command)
    app.command("evaluate", help="Evaluate one finished job: metrics and FPS by the documented protocol.")(
        evaluate_command)
    app.command("predict", help="Run a job's checkpoint, an export or a registered model on images, a folder, a "
                "glob or a video: COCO results with class names.")(predict_command)
    app.add_typer(registry_app, name="registry", help="The model registry: list, register, promote, manifest.")
    app.command("check", help="Preflight: stack, GPUs, binding, NCCL bandwidth, disk, data, environment; "
                "exit 1 on any FAIL.")(check_command)
    app.add_typer(data_app, name="data", help="Data sets: check, hash (version), split, slice, convert, watch, synth.")
    app.command("drill", help="Train a job under injected faults (kill, hang, ckpt_kill): success rate, exact "
                "weights, recovery time, goodput.")(drill_command)
    app.command("goodput", help="A job's effective training time ratio and the work lost per failure.")(
        goodput_command)
    app.command("plan", help="Parallel layouts (TP/PP/DP/CP/EP/ZeRO): memory, step time, MFU; search or evaluate.")(
        plan_command)
    app.command("report", help="Diagnose a run from its telemetry (label + evidence); write report.html and a "
                "Chrome/Perfetto trace.")(report_command)


_register_optional_commands()


def _no_type(option):  # noqa: ANN001, ANN202 - typer's help option (or None)
    if option is not None and option.metavar is None:
        option.metavar = ""  # shown as `--help`, not `--help <bool>`
    return option


class _Command(typer.core.TyperCommand):
    """A command whose --help shows no value type (it takes none)."""

    def get_help_option(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        return _no_type(super().get_help_option(ctx))


class _Group(typer.core.TyperGroup):
    """A command group whose --help shows no value type."""

    def get_help_option(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        return _no_type(super().get_help_option(ctx))


def _flags_show_no_type(typer_app: typer.Typer) -> None:
    """Help lists `--resume`, not `--resume <bool>`: an on/off flag takes no value, so it shows no type."""
    import inspect

    from typer.models import DefaultPlaceholder, OptionInfo

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
    """Musubi: train a fleet of PyTorch models across many GPUs as one system."""


_flags_show_no_type(app)


def main() -> None:  # pragma: no cover - console entry point
    """Entry point for `python -m musubi.cli`."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
