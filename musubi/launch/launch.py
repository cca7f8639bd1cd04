"""Launcher side of `musubi train`: checks -> spawn -> wait -> post-mortem.

Workers are always started by torchrun (`torch.distributed.run`), one process
per GPU or N gloo CPU ranks; Musubi never writes its own launcher. Every check
that can refuse a job runs first (launch/checks.py, the same list `--dry-run`
runs), so a bad job fails in well under a second with one line, and an existing
run directory is never overwritten.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from musubi.contract.env import MUSUBI_CLIENT_PID, MUSUBI_DEVICE
from musubi.contract.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK
from musubi.contract.run_files import RUN_FILES
from musubi.launch.checks import Admitted, admit, say
from musubi.launch.job_record import close_attempt, open_record
from musubi.launch.multinode import Rendezvous, rendezvous_error
from musubi.launch.request import RunFinished, TrainRequest, TrainResult
from musubi.launch.spare import (
    WarmSpare,
    agent_command,
    client_command,
    name_log,
    start_spare,
    stop_spare,
    wanted,
)
from musubi.store.startup import mark
from musubi.topology.cores import usable_cores


@dataclass
class Prepared:
    """A job past its checks with its records laid out: what spawn starts."""

    run_dir: Path
    job_dir: Path
    record: dict
    nproc: int
    kind: str
    spare: WarmSpare | None = None  # started during the checks (prepare's `warm`)


def prepare(req: TrainRequest, warm: bool = False) -> Prepared:
    """Run the launch's checks, then lay out RUN/ and RUN/JOB/job.json (node 0 only: it owns the records). `warm`:
    start the warm spare once the cheap checks passed (early_spare), so that its imports overlap the rest and a
    child of it runs the checks that need torch; stopped again on any refusal."""
    a = admit(req, start=early_spare if warm else None)
    try:
        return _lay_out(req, a)
    except BaseException:
        if a.spare is not None:
            stop_spare(a.spare)
        raise


def _lay_out(req: TrainRequest, a: Admitted) -> Prepared:
    """The run's records of an admitted job (prepare's second half)."""
    req.marks["admitted"] = time.time()
    rdzv = req.rendezvous
    if a.follower:
        # Another node's agent: node 0 owns the records (shared storage, one writer); our workers start only
        # once every agent joined the rendezvous, so node 0 has written job.json by then.
        (a.job_dir / RUN_FILES.logs).mkdir(parents=True, exist_ok=True)
        return Prepared(a.run_dir, a.job_dir, {"config": a.spec.resolved(), "attempts": 0}, a.nproc, a.kind, a.spare)
    attempts = int(a.before.get("attempts", 0)) + 1 if req.resume else 1
    record = open_record(a.run_dir, a.job_dir, a.spec.resolved(), attempts=attempts, nproc=a.nproc, kind=a.kind,
                         resume=req.resume, nnodes=rdzv.nnodes if rdzv else 1, preflight=a.preflight,
                         fleet_member=req.fleet_member, before=a.before, changes=a.changes, argv=req.argv,
                         from_start=a.from_start)
    req.marks["prepared"] = time.time()
    return Prepared(a.run_dir, a.job_dir, record, a.nproc, a.kind, a.spare)


def early_spare(a: Admitted) -> WarmSpare | None:
    """The launch's warm spare, started as the cheap checks passed, with the ranks' environment as far as it is known
    before their pinning (worker_env); None when the job or the environment turns it off, or it cannot start (spawn
    then tries again and writes why into the job's log)."""
    env = worker_env(a.kind, a.nproc, bool(a.spec.train.deterministic))
    if not wanted({"warm_spare": a.spec.train.warm_spare}, env):
        return None
    try:
        return start_spare(a.spec.resolved(), env)
    except OSError:
        return None


def _wait(proc: subprocess.Popen, deadline_s: float | None, spare: WarmSpare | None = None) -> tuple[int, bool]:
    """torchrun's exit code; past the deadline torchrun and every worker it started are ended (TERM, then KILL),
    the agent and the ranks under the warm spare (its children, not the launcher's or torchrun's) included."""
    from musubi.launch.proctree import stop_trees

    try:
        return proc.wait(timeout=deadline_s), False
    except subprocess.TimeoutExpired:
        stop_trees([proc] + ([spare.proc] if spare is not None else []), grace=15)
        return proc.wait(), True


def torchrun_argv(job_dir: Path, nproc: int, resume: bool, stop_at_step: int | None, max_restarts: int = 0,
                  probe_only: bool = False, extra: list[str] | None = None,
                  rdzv: Rendezvous | None = None, from_start: bool = False,
                  entry: list[str] | None = None, agent: list[str] | None = None) -> list[str]:
    """The torchrun command line of one job: single-node (its own free port on loopback) or one node's agent.

    `--max-restarts`: when a rank fails (an OOM, a crash), torchrun stops the others and
    restarts all of them (on every node); the workers resume from the newest committed checkpoint.
    `from_start`: a --resume the checks found no checkpoint for; the ranks resume if one appeared, else start at 0.
    `entry`: what torchrun starts per rank (the warm spare's client, launch/spare.py); default `-m` the worker.
    `agent`: what runs torchrun's agent (the warm spare's client); default this Python, `-m` the bound rendezvous.
    """
    from musubi.contract.rendezvous import torchrun_module

    # torchrun behind a rendezvous bound to the endpoint's address (127.0.0.1 for `--standalone`), never to
    # every interface.
    where = rdzv.torchrun_args() if rdzv is not None else ["--standalone", "--nnodes=1"]
    argv = [*(agent or [sys.executable, *torchrun_module()]), *where, f"--nproc-per-node={nproc}",
            # torchrun's own default: a rank's exit (done, OOM, crash) is acted on within 0.1 s, not 0.5 s.
            f"--max-restarts={max_restarts}", "--monitor-interval=0.1",
            # torchrun's own files (per-attempt error records) stay in the run, not in $TMPDIR.
            f"--log-dir={job_dir / RUN_FILES.logs / 'torchelastic'}",
            *(extra or []), *(entry or ["-m", "musubi.worker.worker"]), str(job_dir)]
    if probe_only:
        argv.append("--probe-only")
    if resume:
        argv.append("--resume-if-any" if from_start else "--resume")
    if stop_at_step is not None:
        argv += ["--stop-at-step", str(stop_at_step)]
    return argv


def worker_env(kind: str, nproc: int, deterministic: bool, job_dir: Path | None = None) -> dict[str, str]:
    """Environment of the workers: device kind, thread counts, determinism switches, hang diagnostics."""
    env = dict(os.environ)
    env.pop(MUSUBI_CLIENT_PID, None)  # a launch from inside a forked rank: its ranks are not that client
    if job_dir is not None:
        from musubi.preflight import diagnostic_env

        # Flight recorder + dump on timeout into the job's logs, unless the user set them.
        env.update(diagnostic_env(job_dir, env))
    env[MUSUBI_DEVICE] = kind
    env["PYTHONUNBUFFERED"] = "1"
    from musubi.contract.rendezvous import single_node_env

    env.update(single_node_env(env))  # one node: the ranks' gloo/NCCL sockets listen on loopback only
    # Split the cores between ranks instead of letting each rank spawn one thread per core.
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // nproc)))
    if deterministic:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
    return env


def _tee_stderr(stream, log_path: Path) -> threading.Thread:
    """Copy torchrun's stderr to a file (secret values scrubbed); only our workers' one-line errors reach the console."""
    from musubi.store.redact import scrub_text, secret_values

    secrets = secret_values()

    def pump() -> None:
        with open(log_path, "a", encoding="utf-8") as f:
            for line in stream:
                f.write(scrub_text(line, secrets))
                f.flush()

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    return th


def first_error(job_dir: Path) -> tuple[str | None, str | None]:
    """(kind, message) of the lowest rank that recorded an error."""
    logs = job_dir / RUN_FILES.logs
    files = sorted(logs.glob("error-rank*.txt"), key=lambda p: int(p.stem.removeprefix("error-rank"))) \
        if logs.is_dir() else []
    for p in files:
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
            return rec.get("kind"), f"rank {p.stem.removeprefix('error-rank')}: {rec.get('message')}"
        except ValueError:
            continue
    return None, None


def _term_as_interrupt():  # noqa: ANN202 - the previous handler, or None off the main thread
    def raise_interrupt(signum: int, frame: object) -> None:  # noqa: ARG001
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:  # not the main thread
        return None


@dataclass
class Spawned:
    """A started torchrun and what the post-mortem needs to read its end."""

    proc: subprocess.Popen
    run_dir: Path
    job_dir: Path
    record: dict
    node: str  # "" or "-node<R>": the suffix of this agent's own log files
    started: float
    follower: bool  # another node's agent: node 0 records the job's outcome
    pump: threading.Thread | None = None
    probe_out: str | None = None
    spare: WarmSpare | None = None  # the ranks' warm spare (launch/spare.py), stopped once torchrun ended


def spawn(req: TrainRequest, run_dir: Path, job_dir: Path, record: dict, nproc: int, kind: str,
          max_restarts: int | None = None, warm_spare: bool = True, spare: WarmSpare | None = None) -> Spawned:
    """Start torchrun for the job: workers' environment and pinning, the start-up marks, stderr into the log
    (`max_restarts`: torchrun's budget when not the job's; `warm_spare`: False for a relaunch after its death;
    `spare`: the one the checks started, else one is started here)."""
    from musubi.launch.pin_plan import apply_to_env, plan_pinning
    from musubi.topology.read import env_topology

    rdzv = req.rendezvous
    train = record["config"]["train"]
    logs = job_dir / RUN_FILES.logs
    logs.mkdir(parents=True, exist_ok=True)
    for old in ([] if rdzv is not None and not rdzv.is_first else logs.glob("error-rank*.txt")):
        old.unlink()
    env = worker_env(kind, nproc, bool(train["deterministic"]), job_dir)
    # A lone single-node job reads the topology the env.json it just wrote holds (one reading of the machine).
    topo = env_topology(run_dir / RUN_FILES.env) if kind == "cuda" and rdzv is None and not req.fleet_member else None
    pins = plan_pinning(bool(train.get("pin_cpus", True)), kind, nproc, env, topo)
    env = apply_to_env(pins, env)
    node = f"-node{rdzv.node_rank}" if rdzv is not None else ""
    if rdzv is not None:  # several nodes: the workers' sockets on the chosen interface, not loopback
        env.update(rdzv.socket_env(os.environ))
    (logs / f"pinning{node}.txt").write_text(pins.note + "\n", encoding="utf-8")
    restarts = 0 if req.probe_only else int(train["max_restarts"]) if max_restarts is None else max_restarts
    # torch imported once per launch: a warm spare forks torchrun's agent and each rank (and restart) from itself.
    if spare is None and warm_spare and wanted(train, env):
        try:
            spare = start_spare(record["config"], env)
        except OSError as e:  # no folder for its socket: the ranks start the plain way, and the log says why
            (logs / f"spare{node}.log").write_text(f"warm spare not started: {e}\n", encoding="utf-8")
    if spare is not None:  # before the agent's fork: its line lands in the job's log
        name_log(spare, logs / f"spare{node}.log")
    argv = torchrun_argv(job_dir, nproc, req.resume, req.max_steps, restarts, req.probe_only, pins.torchrun_args,
                         rdzv, from_start=bool(record.get("from_start")),
                         entry=client_command(spare) if spare is not None else None,
                         agent=agent_command(spare) if spare is not None else None)
    started = time.time()
    if rdzv is None or rdzv.node_rank == 0:
        for name, when in req.marks.items():
            mark(job_dir, name, when)
        mark(job_dir, "launcher", started)
    where = f" on node {rdzv.node_rank} of {rdzv.nnodes}" if rdzv is not None else ""
    say(req, f"launching {nproc} {'GPU' if kind == 'cuda' else 'CPU'} rank{'s' if nproc > 1 else ''}{where} "
        f"(torchrun); each imports torch and joins the process group...")
    try:
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, errors="replace",
                                stdout=subprocess.PIPE if req.probe_only else (subprocess.DEVNULL if req.quiet else None),
                                start_new_session=req.deadline_s is not None)  # its own group: the deadline ends all
    except BaseException:
        if spare is not None:
            stop_spare(spare)
        raise
    s = Spawned(proc, run_dir, job_dir, record, node, started, follower=rdzv is not None and not rdzv.is_first,
                spare=spare)
    if req.probe_only:
        assert proc.stdout is not None
        s.probe_out = proc.stdout.read()
    s.pump = _tee_stderr(proc.stderr, logs / f"torchrun{node}.log")
    return s


@dataclass
class Ended:
    """How torchrun ended: its exit code, past the deadline, or stopped by Ctrl-C / SIGTERM."""

    code: int
    timed_out: bool = False
    interrupted: bool = False
    spare_died: str | None = None  # how the warm spare died under torchrun's agent ("signal 9"): the agent died too
    cause: str | None = None  # the launch's one-line error when the launcher knows it better than the ranks


def wait(req: TrainRequest, s: Spawned) -> Ended:
    """Wait for torchrun; SIGTERM (e.g. from `musubi run`) stops it like Ctrl-C does; reap what the ranks left."""
    from musubi.checkpoint.daemons import reap_checkpoint_daemons
    from musubi.launch.spare import died

    old_term = _term_as_interrupt()
    try:
        code, timed_out = _wait(s.proc, req.deadline_s, s.spare)
        ended = Ended(code, timed_out, spare_died=None if timed_out else died(s.spare, code))
    except KeyboardInterrupt:
        s.proc.terminate()
        ended = Ended(s.proc.wait(), interrupted=True)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if s.spare is not None:
            stop_spare(s.spare)
    reap_checkpoint_daemons(s.job_dir)  # checkpoint processes of ranks that died (they hold our pipes)
    if s.pump is not None:
        s.pump.join(timeout=5)
    return ended


def post_mortem(req: TrainRequest, s: Spawned, ended: Ended) -> TrainResult:
    """The launch's outcome: status and the one-line error, recorded in job.json's history (node 0)."""
    err_kind, err = first_error(s.job_dir)
    status, result_code = "done", EXIT_OK
    log = s.job_dir / RUN_FILES.logs / f"torchrun{s.node}.log"
    if ended.code != 0:
        status, result_code = "failed", EXIT_CONFIG if err_kind == "config" else EXIT_FAILED
        if req.rendezvous is not None and err is None:
            err = rendezvous_error(req.rendezvous, log)
        if ended.timed_out:
            err = f"did not finish within {req.deadline_s:.0f} s (deadline): torchrun and its workers were ended"
        if ended.interrupted:
            status, err = "interrupted", "interrupted (Ctrl-C or SIGTERM): torchrun and its ranks were stopped"
        if err is None:
            err = f"torchrun exited with {ended.code}; see {log}"
        if ended.cause is not None:
            err_kind, err = "spare", ended.cause  # not a rank's failure: goodput's cause must not replace it
    if not s.follower:
        err = close_attempt(s.job_dir, s.record, code=ended.code, status=status, err=err, err_kind=err_kind,
                            started=s.started, timed_out=ended.timed_out, probe_only=req.probe_only)
    if ended.interrupted:  # recorded above; the caller decides (musubi train exits 130, a drill stops)
        raise KeyboardInterrupt
    if s.probe_out:
        print(s.probe_out.strip().splitlines()[-1] if s.probe_out.strip() else "", flush=True)
    return TrainResult(result_code, s.run_dir, s.job_dir, err, ended.timed_out)


def launch_train(req: TrainRequest) -> TrainResult:
    """Run one job under torchrun to completion: checks -> spawn -> wait -> post-mortem; never raises for worker
    failures."""
    req.marks.setdefault("entered", time.time())
    try:
        p = prepare(req, warm=True)
    except RunFinished as done:  # reported from job.json alone: no torchrun, no torch
        return TrainResult(EXIT_OK, done.run_dir, done.job_dir, error=str(done), already_finished=True)
    try:
        s = spawn(req, p.run_dir, p.job_dir, p.record, p.nproc, p.kind, spare=p.spare)
    except BaseException:
        if p.spare is not None:  # started by the checks: no torchrun will take it along
            stop_spare(p.spare)
        raise
    ended = wait(req, s)
    if ended.spare_died is not None:
        return without_spare(req, s, ended, p.nproc, p.kind)
    return post_mortem(req, s, ended)


def without_spare(req: TrainRequest, s: Spawned, ended: Ended, nproc: int, kind: str) -> TrainResult:
    """The warm spare died and torchrun's agent (its child) with it: relaunch once without a spare, from the
    newest committed checkpoint as a torchrun restart would, within what is left of train.max_restarts and the
    deadline. Several nodes: this agent cannot rejoin the others' rendezvous, so the launch fails naming the fix."""
    from musubi.checkpoint.committed import latest_checkpoint
    from musubi.store.rundir import write_json

    ckpt = latest_checkpoint(s.job_dir / RUN_FILES.checkpoints, warn=False)
    step = ckpt.step if ckpt is not None else 0
    why = f"warm spare died ({ended.spare_died})"
    progress = s.job_dir / RUN_FILES.progress  # one file per torchrun attempt of this launch (job_record.py)
    used = max(0, len(list(progress.glob(f"a{s.record['attempts']}.*.jsonl"))) - 1) if progress.is_dir() else 0
    left_restarts = int(s.record["config"]["train"]["max_restarts"]) - used - 1  # the relaunch is a restart
    left_s = None if req.deadline_s is None else req.deadline_s - (time.time() - s.started)
    relaunch = False
    if req.rendezvous is not None:
        ended.cause = (f"{why} on node {req.rendezvous.node_rank}: torchrun's agent died with it and cannot rejoin "
                       "the other nodes' rendezvous; set train.warm_spare: false (torchrun then restarts plain ranks)")
    elif req.probe_only or left_restarts < 0 or (left_s is not None and left_s <= 0):
        ended.cause = f"{why}: no restart left (train.max_restarts or the deadline); --resume continues from step {step}"
    else:
        relaunch, ended.cause = True, f"{why}: relaunched without it, from step {step}"
    say(req, ended.cause)
    first = post_mortem(req, s, ended)
    if not relaunch:
        return first
    # A new launch of the same folder (job.json attempts + 1), as `--resume` makes one; the restarts torchrun
    # made in the first and this relaunch itself come off the job's train.max_restarts.
    record = {k: v for k, v in s.record.items() if k != "from_start"}
    record.update(status="running", attempts=int(record["attempts"]) + 1, resume=True, relaunch=ended.cause,
                  **({"from_start": True} if ckpt is None else {}))
    write_json(s.job_dir / RUN_FILES.job, record)
    again = replace(req, resume=True, deadline_s=left_s, marks={})
    s2 = spawn(again, s.run_dir, s.job_dir, record, nproc, kind, max_restarts=left_restarts,
               warm_spare=False)
    return post_mortem(again, s2, wait(again, s2))
