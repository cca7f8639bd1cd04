"""`musubi train` and `musubi run`: the two launching commands (parse, call musubi.launch / musubi.fleet, print)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from musubi.cli.output import fail, guarded, out_console
from musubi.contract.exits import EXIT_FAILED
from musubi.contract.run_files import RUN_FILES

#: Help of the positional overrides: the same keys as --set, in the form Hydra and Ultralytics users type.
OVERRIDES_HELP = ("Job fields to override, as key=value (train.epochs=3 data.workers=0): the same as --set, "
                  "validated by the same schema; an unknown key gets a did-you-mean.")


#: `musubi train`'s options, one alias each (typer reads the help from the annotation).
Nproc = Annotated[int | None, typer.Option("--nproc", help="Ranks: default all visible GPUs, else 2 CPU ranks.")]
Out = Annotated[Path | None, typer.Option("--out", help="Run directory (default runs/<time>-<name>).")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue from the newest committed checkpoint.")]
MaxSteps = Annotated[int | None, typer.Option(
    "--max-steps", help="Stop (and checkpoint) after this global optimizer step; the LR schedule is unchanged, so a "
    "later --resume continues exactly.")]
SetOption = Annotated[list[str], typer.Option("--set", help="Override a job field: --set train.batch=32 (repeatable).")]
Device = Annotated[str | None, typer.Option("--device", help="cuda or cpu (default: cuda if a GPU is visible).")]
ProbeOnly = Annotated[bool, typer.Option("--probe-only", help="With batch: auto, probe (or read the cache), print the "
                                         "agreed batch as JSON and exit.")]
NoCheck = Annotated[bool, typer.Option("--no-check", help="Skip the preflight (job.json records that).")]
FleetMember = Annotated[bool, typer.Option("--fleet-member", hidden=True, help="Started by `musubi run`: RUN/ is the "
                                           "fleet's, only RUN/JOB/ is ours.")]
Nnodes = Annotated[int, typer.Option("--nnodes", help="Nodes of the job: run `musubi train` with the same arguments on "
                                     "each (c10d rendezvous; --nproc is per node).")]
NodeRank = Annotated[int, typer.Option("--node-rank", help="This node's rank, 0..nnodes-1 (0 hosts the rendezvous).")]
RdzvEndpoint = Annotated[str | None, typer.Option("--rdzv-endpoint", help="HOST:PORT of node 0's rendezvous store "
                                                  "(multi-node).")]
RdzvId = Annotated[str | None, typer.Option("--rdzv-id", help="Rendezvous id (default: job name + run dir).")]
RdzvTimeout = Annotated[int, typer.Option("--rdzv-timeout", help="Seconds to wait for every node to join.")]
Iface = Annotated[str | None, typer.Option("--iface", help="Network interface of the rendezvous and gloo/NCCL sockets "
                                           "(default: the one that routes to the endpoint).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Run every check the launch runs (the same list), print the "
                                      "plan (ranks, batches, LR and why, data, output); start and write nothing.")]
Oversubscribe = Annotated[bool, typer.Option("--oversubscribe", help="Allow more CPU ranks than cores (they share "
                                             "cores and run slower).")]
AllowChanges = Annotated[list[str], typer.Option("--allow-changes", help="With --resume: job fields that may differ "
                                                 "from the recorded job, e.g. train.lr,data (job.json records the "
                                                 "change).")]


def train(
    job: Annotated[Path, typer.Argument(help="Job YAML (see examples/).")],
    overrides: Annotated[list[str] | None, typer.Argument(metavar="KEY=VALUE", help=OVERRIDES_HELP,
                                                          show_default=False)] = None,
    nproc: Nproc = None, out: Out = None, resume: Resume = False, max_steps: MaxSteps = None,
    set_: SetOption = [],  # noqa: B006 - typer's default of a repeatable option, never mutated
    device: Device = None, probe_only: ProbeOnly = False, no_check: NoCheck = False,
    fleet_member: FleetMember = False, nnodes: Nnodes = 1, node_rank: NodeRank = 0,
    rdzv_endpoint: RdzvEndpoint = None, rdzv_id: RdzvId = None, rdzv_timeout: RdzvTimeout = 300,
    iface: Iface = None, dry_run: DryRun = False, oversubscribe: Oversubscribe = False,
    allow_changes: AllowChanges = [],  # noqa: B006 - as set_
) -> None:
    """Train one job on all GPUs of this machine (or N CPU ranks), or on several nodes, through torchrun."""
    entered = time.time()  # Python started and the CLI imported: the launcher's first start-up part ends here
    from musubi.launch.checks import dry_run_plan
    from musubi.launch.launch import launch_train
    from musubi.launch.request import TrainRequest

    if max_steps is not None and max_steps < 1:
        fail(f"--max-steps {max_steps}: must be >= 1")
    if allow_changes and not resume:
        fail("--allow-changes goes with --resume (a new run records whatever job it is given)")
    quiet = probe_only or dry_run  # a dry run prints its plan, not the launch's start-up lines
    say = None if quiet else (lambda line: Console(soft_wrap=True).print(escape(line), highlight=False))
    req = TrainRequest(job_path=job, nproc=nproc, out=out, resume=resume, max_steps=max_steps,
                       overrides=[*set_, *(overrides or [])], device=device, argv=sys.argv, probe_only=probe_only,
                       check=not no_check, fleet_member=fleet_member, nnodes=nnodes, node_rank=node_rank,
                       rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, rdzv_timeout_s=rdzv_timeout, iface=iface,
                       oversubscribe=oversubscribe, allow_changes=list(allow_changes), say=say,
                       marks={"entered": entered})
    if dry_run:
        for line in guarded(dry_run_plan, req):
            print(line)
        print("dry run: nothing started, nothing written")
        return
    report_training(guarded(launch_train, req), quiet=probe_only or node_rank > 0, fleet_member=fleet_member)


def report_training(result: Any, quiet: bool, fleet_member: bool) -> None:  # noqa: ANN401 - a TrainResult
    """After `musubi train`: the error line and its exit code, else the goodput line, the checklist, the folder
    (`quiet`: a probe, or another node: node 0 reports the run)."""
    if result.already_finished:
        Console(soft_wrap=True).print(escape(result.error or ""), highlight=False)
        return
    if result.code != 0:
        fail(f"{result.error} (logs: {result.job_dir / RUN_FILES.logs})", result.code)
    if quiet:
        return
    _print_goodput(result.job_dir)
    if not fleet_member and not checklist_met(result.run_dir, Console()):
        fail(f"the run did not meet its success criteria (see {result.run_dir / RUN_FILES.checklist})", EXIT_FAILED)
    Console().print(f"[green]run directory:[/] {escape(str(result.run_dir))}", highlight=False)


def checklist_met(run_dir: Path, console: Console) -> bool:
    """Build and write the run's checklist, print its summary (records/checklist.py); True when it met its criteria."""
    from musubi.records.checklist import build_checklist, render_summary, write_checklist

    cl = build_checklist(run_dir)
    write_checklist(run_dir, cl)
    render_summary(cl, console)
    return cl.ok


def _print_goodput(job_dir: Path) -> None:
    """After a run that restarted: the goodput line (what the failures cost)."""
    from musubi.recovery.goodput import goodput_line

    path = job_dir / RUN_FILES.goodput
    if path.is_file():
        rec = json.loads(path.read_text(encoding="utf-8"))
        if rec.get("failures"):
            Console().print(goodput_line(rec), highlight=False)


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
        fail("--replay RUN_DIR simulates a recorded run: it goes with --dry-run")
    if gpus is not None and not dry_run:
        fail("--gpus N plans a machine of N GPUs: it goes with --dry-run (a real run uses the visible GPUs)")
    console = out_console()  # under a pipe (CI, a log file) rich would squeeze the live table into 80 columns
    if dry_run:
        guarded(plan_fleet, req, console)
        return
    try:
        run_dir, states = guarded(run_fleet, req, console)
    except FleetInterrupted as e:
        fail(f"{e}: the running jobs were stopped and recorded as interrupted; continue with "
             f"`musubi run {fleet} --out {e.run_dir} --resume`", e.code)
    t0 = time.perf_counter()
    met = checklist_met(run_dir, console)
    # The end phase in fleet.json (bench/fleet.py: the time after the last job, split).
    note_finish(run_dir, checklist_s=round(time.perf_counter() - t0, 3), checked_at=round(time.time(), 3))
    failed = [s.name for s in states.values() if s.state != "done"]
    if failed:
        fail(f"{len(failed)} job(s) failed: {', '.join(failed)} (causes in {run_dir / RUN_FILES.fleet})", EXIT_FAILED)
    if not met:
        fail(f"the fleet did not meet its success criteria (see {run_dir / RUN_FILES.checklist})", EXIT_FAILED)
    Console().print(f"[green]run directory:[/] {escape(str(run_dir))}", highlight=False)

