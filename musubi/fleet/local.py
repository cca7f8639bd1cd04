"""The local executor: a whole fleet on one machine's GPUs (or CPU rank slots).

Each job gets GPUs of its own and its own process tree (`musubi train` →
torchrun, with its own rendezvous port; or the external command). When a job
ends well, its evaluation step runs on the same GPUs; then the GPUs go back to
the packer. A failed job is retried (bounded; never after a configuration
error) and never stops the others. `RUN/fleet.json` holds every job's state, so
`--resume` skips finished jobs and resumes unfinished ones from their
checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from musubi.checkpoint.committed import latest_checkpoint  # the torch-free marker reader
from musubi.config.fleet import CommandJob, FleetSpec, LeaderboardSpec, TaskJob
from musubi.contract.env import MUSUBI_GATE, MUSUBI_GATE_PID, MUSUBI_JOB_DIR
from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG
from musubi.contract.run_files import RUN_FILES
from musubi.fleet import jobs
from musubi.fleet.durations import Estimate, demand_of, estimate, machine_of, record_run, record_shared_run
from musubi.fleet.gpu_watch import stop_watching, watch_command
from musubi.fleet.machine import SHOW, cpus_value, describe_cpus, device_cores, device_unit, fleet_topology
from musubi.fleet.moldable import best_plan
from musubi.fleet.packer import Demand, Packer, unplaceable
from musubi.fleet.sharing import overlap_s, share_policy
from musubi.fleet.stop import FleetInterrupted, signals_flagged
from musubi.launch.proctree import stop_trees
from musubi.store.db import db_path
from musubi.store.rundir import read_json, write_json
from musubi.store.startup import EVAL_GPU_DONE, components, mark, marks_of, summary_line
from musubi.telemetry.watch import current_stragglers, describe
from musubi.topology.cores import usable_cores

log = logging.getLogger("musubi.fleet")


#: GiB a second process on a GPU costs beyond its tensors (CUDA context, NCCL buffers): two jobs declaring
#: memory_gib share a GPU's tail only when both fit with this much to spare.
CONTEXT_GIB = 2.0

#: Seconds another job must still be predicted to train for a job whose training just ended to export its model
#: to ONNX in its evaluation step (the fleet's top-k are otherwise exported after the last job). A CNN's export
#: and registration take seconds, a GPT's far longer (BENCHMARKS.md, fleet). With this
#: margin a CNN's export ends while the other job still trains, off the critical path; nearer the end it could
#: outlast the last job and lengthen the fleet for a model that may not rank in the top-k at all.
EARLY_EXPORT_MARGIN_S = 30.0


@dataclass
class JobState:
    """One job's life in the fleet (what fleet.json records)."""

    name: str
    kind: str  # task | command
    state: str = "queued"  # queued | starting | running | evaluating | done | failed | interrupted
    gpus: list[int] = field(default_factory=list)
    attempts: int = 0
    causes: list[str] = field(default_factory=list)
    started: float | None = None
    ended: float | None = None
    placement: str = ""  # why the job got its GPUs (the packer's reason)
    scheduler_id: str = ""  # Slurm executor: the job's Slurm id (the newest submission)
    scheduler_state: str = ""  # Slurm executor: its state as squeue/sacct last said
    log: str = ""  # Slurm executor: the batch log (RUN/JOB/logs/slurm-ID.log)
    interruptions: int = 0  # attempts stopped by a signal to `musubi run` (not counted in `attempts`)
    restarts: int = 0  # torchrun restarts inside the job's launches (failures it recovered from by itself)
    failures: list[dict[str, Any]] = field(default_factory=list)  # every failure of every launch (job.json)
    goodput: float | None = None  # the job's goodput (JOB/goodput.json) after its latest launch
    width: int = 0  # GPUs of the latest attempt (a moldable job resumed from a checkpoint keeps it)
    predicted_s: float | None = None  # the duration model's seconds for the latest attempt on its GPUs
    estimate: str = ""  # where that prediction came from (history, probe, declared, fallback)
    precision: str = ""  # task jobs: the precision training ended in (after any numerical fallback)
    early_export: str = ""  # task jobs: what this one's export ran beside when its evaluation was asked to export
    # (it exports only if it ranks in the top-k so far: fleet.json's "exported_early" says which did)
    released: float | None = None  # GPUs back to the packer (training ended, with machine.overlap; else the end)
    startup: dict[str, float] = field(default_factory=dict)  # the latest attempt's start-up (store/startup.py)
    shared_with: list[str] = field(default_factory=list)  # jobs that shared its GPU during the latest attempt
    history: list[dict[str, Any]] = field(default_factory=list)  # per attempt: gpus, started, released, ended, outcome


@dataclass
class _Running:
    job: TaskJob | CommandJob
    proc: subprocess.Popen
    phase: str  # train | eval
    log_file: Any
    evaluator: subprocess.Popen | None = None  # the evaluation step started early (machine.overlap)
    samplers: list[Any] = field(default_factory=list)  # an external command's GPUs sampled by the fleet


def fleet_states(spec: FleetSpec, state_path: Path | None) -> dict[str, JobState]:
    """Every job's state: fresh, or as RUN/fleet.json recorded it (--resume; each executor then decides
    what an unfinished state becomes)."""
    states = {j.name: JobState(j.name, "command" if isinstance(j, CommandJob) else "task") for j in spec.jobs}
    if state_path is not None and state_path.is_file():
        for name, rec in read_json(state_path).get("jobs", {}).items():
            if name in states:
                states[name] = JobState(**rec)
    return states


def previous_best(runs_base: Path, fleet_name: str, current: Path) -> str | None:
    """The rank-1 job of the newest earlier run of this fleet (it runs first this time).

    Earlier runs are the run folders beside `current` and those the store's leaderboard history knows,
    whose RUN/run.json names this fleet (whatever the folders are called: `--out` included).
    """
    candidates: list[Path] = [p for p in runs_base.iterdir() if p.is_dir()] if runs_base.is_dir() else []
    try:
        from musubi.evaluate.registry import leaderboard_history

        candidates += [Path(h["run_dir"]) for h in leaderboard_history(run_dir=current)]
    except Exception:  # noqa: BLE001 - an unreadable store only costs the ordering hint
        pass
    earlier: dict[Path, str] = {}
    for run in candidates:
        try:
            if run.resolve() == current.resolve() or run.resolve() in earlier or \
                    not (run / RUN_FILES.leaderboard).is_file():
                continue
            record = read_json(run / RUN_FILES.run)
            if record["config"]["name"] == fleet_name:
                earlier[run.resolve()] = str(record.get("started") or "")
        except (OSError, ValueError, RecursionError, TypeError, KeyError):
            continue
    for run in sorted(earlier, key=lambda r: (earlier[r], r.name), reverse=True):
        try:
            rows = read_json(run / RUN_FILES.leaderboard)
            rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
            # Only a ranked job is a best model: a run that ranked nothing has none to put first.
            top = [r for r in rows if isinstance(r, dict) and r.get("rank") == 1]
            if top:
                return top[0].get("job") or top[0].get("name")
        except (OSError, ValueError, RecursionError, TypeError, KeyError):
            continue  # an unreadable old leaderboard only costs the ordering hint
    return None


def estimates(spec: FleetSpec, capacity: int, db: Path | None, machine: list[Any], kind: str) -> dict[str, Estimate]:
    """Every job's predicted seconds on each width it may get on a machine of `capacity` devices."""
    out = {}
    for j in spec.jobs:
        widths = tuple(w for w in (j.widths if isinstance(j, TaskJob) else (j.gpus,)) if w <= capacity) or (j.gpus,)
        out[j.name] = estimate(j, widths, db, machine, kind)
    return out


def early_export(export_top: int, waiting: int, others_left: dict[str, float],
                 margin: float = EARLY_EXPORT_MARGIN_S, gpus_back_first: bool = False) -> str | None:
    """Whether a job whose training just ended exports its model during its evaluation step: what the export
    runs beside, in words, else None.

    Only when the fleet exports at all (`export_top` > 0), and then:
    - jobs wait for the freed GPUs/cores (`waiting`: queued jobs and jobs gated on this one's evaluation):
      only when the step gives its GPUs back before exporting (`gpus_back_first`: machine.overlap, the
      fleet opens the gate at the step's EVAL_GPU_DONE mark), so the export (on the CPU) runs beside the
      next job's start instead of before it; the fleet then lasts at least that job longer;
    - none waits: another job is predicted to train `margin` s more (`others_left`: seconds left per other
      training job), so the job that ends last never does.
    """
    if export_top <= 0:
        return None
    if waiting:
        return "beside the next job on its GPUs, which it no longer holds back" if gpus_back_first else None
    if not others_left:
        return None
    name, left = max(others_left.items(), key=lambda kv: kv[1])
    return f"tail; {name} still trains ~{left:.0f} s" if left >= margin else None


def export_request(lb: LeaderboardSpec) -> dict[str, Any]:
    """The trained marker's "export" entry that asks a job's evaluation step for an early export: the fleet's
    leaderboard settings, so that step exports only a job ranking within the top `export_top` so far
    (eval_step.export_ask reads it; no early export: `false`)."""
    return {"top": lb.export_top, "weights": [lb.quality_weight, lb.fps_weight], "fps_target": lb.fps_target,
            "quality_floor": lb.quality_floor, "min_quality": lb.min_quality}


class LocalFleet:
    """Runs a validated fleet to the end on this machine."""

    def __init__(self, spec: FleetSpec, run_dir: Path, base: Path, devices: list[int], kind: str,
                 resume: bool, console: Console | None = None, gpu_memory: float | None = None) -> None:
        self.spec, self.run_dir, self.base, self.kind = spec, run_dir, base, kind
        # Unset: on GPUs only. On CPU slots the cores are what a job's start-up and evaluation would take from
        # the training beside them (the demo's jobs trained 13-25 % slower per step with it on 2 cores).
        self.overlap = spec.machine.overlap if spec.machine.overlap is not None else kind == "cuda"
        self.gpu_memory = gpu_memory  # GiB of one GPU (NVML): jobs declaring memory_gib may share a GPU's tail
        #: Jobs started on GPUs whose previous job still evaluates: their gate file and the jobs they wait for.
        self.gates: dict[str, tuple[Path, set[str]]] = {}
        #: Placed jobs that cannot wait at a gate (external commands, evaluation-only retries): spawned later.
        self.deferred: dict[str, tuple[list[int], set[str]]] = {}
        self.console = console or Console()
        self.jobs = {j.name: j for j in spec.jobs}
        self.state_path = run_dir / RUN_FILES.fleet
        self.states = fleet_states(spec, self.state_path if resume else None)
        for st in self.states.values():
            if st.state != "done":  # unfinished jobs queue again and resume from their checkpoints
                st.state, st.gpus = "queued", []
        self.first = previous_best(run_dir.parent, spec.name, run_dir)
        first = self.first
        self.db = db_path(run_dir)
        env = read_json(run_dir / RUN_FILES.env) if (run_dir / RUN_FILES.env).is_file() else None
        self.machine = machine_of(env)
        self.estimates = estimates(spec, len(devices), self.db, self.machine, kind)
        queue = [self._demand(j) for j in spec.jobs if self.states[j.name].state != "done"]
        problems = unplaceable(queue, len(devices))
        if problems:
            raise ConfigError(problems[0])
        topology = fleet_topology(spec, base, run_dir, kind)
        self.packer = Packer(list(devices), queue, topology=topology, planner=best_plan,
                             share=share_policy(spec.machine.share_gpus, kind, gpu_memory), unit=device_unit(kind))
        self.packer.done = {n for n, st in self.states.items() if st.state == "done"}
        self.running: dict[str, _Running] = {}
        self.predicted: dict[str, Any] | None = None  # the first plan: predicted makespan and timeline
        self.startup: dict[str, float] = {}  # the fleet's own start-up before this (run.startup_parts)
        # CPU threads per rank: the cores this fleet may use shared by every device's rank.
        self.threads = max(1, usable_cores() // max(1, len(devices)))
        # Each device's own cores: a job's ranks are pinned to the cores of its GPUs (never another job's).
        self.cores = device_cores(list(devices), topology, kind) if spec.machine.pin_cpus else None
        if first:
            log.info("previous best model %s runs first", first, extra=SHOW)

    def _demand(self, job: TaskJob | CommandJob) -> Demand:
        """What the job asks of the packer: a job with a checkpoint keeps the width it was trained on (its
        sampler position and RNG states are per rank), a fresh moldable job may get any of its widths."""
        est = self.estimates[job.name]
        st = self.states[job.name]
        held = (isinstance(job, TaskJob) and st.width in est.widths
                and latest_checkpoint(self.run_dir / job.name / RUN_FILES.checkpoints) is not None)
        return demand_of(job, est, (st.width,) if held else None, first=(job.name == self.first))

    # -- state ---------------------------------------------------------------
    def save_state(self) -> None:
        """Write fleet.json (atomically)."""
        record: dict[str, Any] = {"fleet": self.spec.name, "device": self.kind,  # cuda | cpu: GPUs or CPU slots
                                  "jobs": {n: vars(s) for n, s in self.states.items()}}
        if self.predicted is not None:
            record["plan"] = self.predicted
        if self.startup:
            record["startup"] = self.startup
        write_json(self.state_path, record)

    # -- starting --------------------------------------------------------------
    def _start(self, job: TaskJob | CommandJob, gpus: list[int]) -> None:
        st = self.states[job.name]
        st.attempts += 1
        st.state, st.gpus, st.started, st.width = "running", gpus, time.time(), len(gpus)
        st.released = None
        st.placement = self.packer.reasons.get(job.name, "")
        st.history.append({"attempt": st.attempts, "gpus": list(gpus), "started": st.started})
        self._note_sharing(job.name)
        est = self.estimates[job.name]
        st.predicted_s = est.at(len(gpus)) if len(gpus) in est.widths else None
        st.estimate = est.source
        blockers = self._tails(job, gpus)
        if blockers and (isinstance(job, CommandJob) or self._trained_marker(job.name).is_file()):
            st.state = "starting"  # it cannot wait at a gate: spawned when those evaluations end
            self.deferred[job.name] = (gpus, blockers)
            return
        self._spawn(job, gpus, blockers)

    def _note_sharing(self, name: str) -> None:
        """Who shares whose GPU, in fleet.json (the job and its attempt's history, for the timeline)."""
        for n in {name} | self.packer.shared_with.get(name, set()):
            st = self.states[n]
            st.shared_with = sorted(self.packer.shared_with.get(n, set()))
            if st.history and st.shared_with:
                st.history[-1]["shared_with"] = st.shared_with

    def _tails(self, job: TaskJob | CommandJob, gpus: list[int]) -> set[str]:
        """Jobs still evaluating on `gpus` (their GPUs went back at the end of training) that `job` must wait
        for before it builds its model; none when both declare memory_gib and one GPU holds both."""
        tails = {n for n, r in self.running.items() if r.phase == "eval" and set(self.states[n].gpus) & set(gpus)
                 and not self._gpus_done(n)}
        need = [self.jobs[n].memory_gib for n in tails] + [job.memory_gib]
        if tails and self.kind == "cuda" and self.gpu_memory and all(need) and \
                max(need[:-1]) + need[-1] + CONTEXT_GIB <= self.gpu_memory:  # type: ignore[operator]
            return set()
        return tails

    def _spawn(self, job: TaskJob | CommandJob, gpus: list[int], blockers: set[str]) -> None:
        st = self.states[job.name]
        st.state = "running"
        if self._evaluate_only(job, st):
            return
        cpus = cpus_value(self.cores, gpus) if self.cores is not None else None
        job_dir = self.run_dir / job.name
        if isinstance(job, TaskJob):
            resume = latest_checkpoint(job_dir / RUN_FILES.checkpoints) is not None
            if not resume and job_dir.exists() and any(p.name != RUN_FILES.logs for p in job_dir.iterdir()):
                # A failed attempt without a checkpoint: keep its files, start clean beside them.
                aside = self.run_dir / f"{job.name}.attempt{st.attempts - 1}"
                job_dir.rename(aside)
            launch = jobs.task_launch(job, self.run_dir, gpus, self.kind, resume, self.threads, cpus,
                                   pin=self.spec.machine.pin_cpus)  # --nproc len(gpus): its width
            if blockers:  # it starts now and builds its model when those evaluations end (worker.wait_for_gate)
                gate = job_dir / RUN_FILES.logs / f"gate-a{st.attempts}"
                gate.unlink(missing_ok=True)
                launch.env.update({MUSUBI_GATE: str(gate), MUSUBI_GATE_PID: str(os.getpid())})
                self.gates[job.name] = (gate, set(blockers))
        else:
            launch = jobs.command_launch(job, self.run_dir, gpus, self.kind, self.base, self.threads * job.gpus, cpus)
        launch.log.parent.mkdir(parents=True, exist_ok=True)
        f = open(launch.log, "a", encoding="utf-8")
        f.write(f"=== musubi run: {job.name} attempt {st.attempts} ===\n")  # tails never mix attempts
        f.flush()
        # The spawn time stays in fleet.json: a file in the job's folder now would read as an earlier run.
        st.history[-1]["spawned"] = time.time()
        # A session of its own: the job's whole process tree can be stopped as one group (fleet/stop.py).
        proc = subprocess.Popen(launch.argv, env=launch.env, cwd=launch.cwd, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        jobs.pin_process(proc.pid, launch.cpus)  # external commands (task jobs' ranks pin themselves)
        # An external command has no telemetry of its own: the fleet samples its GPUs (what sharing decides by).
        watched = watch_command(job_dir, proc.pid, gpus) if isinstance(job, CommandJob) and self.kind == "cuda" \
            else []
        self.running[job.name] = _Running(job, proc, "train", f, samplers=watched)
        log.info("start %s on %s %s (attempt %d): %s%s", job.name, device_unit(self.kind),
                 ",".join(map(str, gpus)), st.attempts, st.placement,
                 f"; {describe_cpus(cpus)}" if cpus else "; CPU pinning off" if self.cores is None else "; not pinned",
                 extra=SHOW)

    def _eval_process(self, run: _Running, after: Path | None) -> subprocess.Popen:
        """The evaluation step on the job's GPUs; `after`: started early, it waits for that file."""
        st = self.states[run.job.name]
        env = dict(os.environ, **jobs.gpu_env(st.gpus, self.kind, self.threads * len(st.gpus)))
        argv = [sys.executable, "-m", "musubi.fleet.eval_step", *(["--after", str(after)] if after else []),
                *(["--external"] if isinstance(run.job, CommandJob) else []), str(self.run_dir / run.job.name)]
        cpus = cpus_value(self.cores, st.gpus) if self.cores is not None else None
        mark(self.run_dir / run.job.name, "eval_spawned")
        proc = subprocess.Popen(argv, env=env, stdout=run.log_file, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        jobs.pin_process(proc.pid, jobs.union_cpus(cpus))
        return proc

    def _prestart_evals(self) -> None:
        """machine.overlap: start each training job's evaluation step once its training is under way (after its
        first step, or 5 s into an external command), so its Python start and imports are not on the critical
        path; it waits for the trained marker."""
        for name, run in self.running.items():
            if run.phase != "train" or run.evaluator is not None:
                continue
            st = self.states[name]
            under_way = ("first_step" in marks_of(self.run_dir / name, st.started) if st.kind == "task"
                         else time.time() - (st.started or 0.0) > 5.0)
            if under_way:
                run.evaluator = self._eval_process(run, self._trained_marker(name))

    def _open_gates(self) -> None:
        """Hand over GPUs whose previous job's evaluation no longer needs them (its FPS measured, or the step
        ended): open gates, spawn deferred jobs."""
        if not self.gates and not self.deferred:  # nothing waits: no evaluation's marks to read this round
            return
        evaluating = {n for n, r in self.running.items() if r.phase == "eval" and not self._gpus_done(n)}
        for name, (gate, blockers) in list(self.gates.items()):
            if not blockers & evaluating:
                gate.parent.mkdir(parents=True, exist_ok=True)
                gate.write_text(f"{time.time()}\n", encoding="utf-8")
                del self.gates[name]
        for name, (gpus, blockers) in list(self.deferred.items()):
            if not blockers & evaluating:
                del self.deferred[name]
                self._spawn(self.jobs[name], gpus, set())

    def _gpus_done(self, name: str) -> bool:
        """Whether `name`'s evaluation step of this attempt has used its GPUs for the last time (eval_step marks
        it after the FPS measurement): the rest (eval.json, an early export on the CPU) need not hold back the
        job behind it, which otherwise waited seconds for the whole step (BENCHMARKS.md, fleet)."""
        return EVAL_GPU_DONE in marks_of(self.run_dir / name, self.states[name].started)

    def _start_eval(self, run: _Running, release: bool = True) -> None:
        job = run.job
        st = self.states[job.name]
        st.state = "evaluating"
        mark(self.run_dir / job.name, "train_exit")
        trained = self._trained_marker(job.name)
        early = isinstance(job, TaskJob) and self._export_early(job)
        export = export_request(self.spec.leaderboard) if early else False
        # A retry (or --resume) after a failed evaluation does not train again: its marker exists and only
        # the export decision is made again. Written atomically: the evaluation step reads it once it exists.
        marker = {"attempt": st.attempts, "time": time.time()}
        if trained.is_file():
            with contextlib.suppress(OSError, ValueError, TypeError):
                marker = dict(read_json(trained))
        write_json(trained, {**marker, "export": export})
        started, run.evaluator = run.evaluator, None
        # Started now, it finds the marker at once (and reads the export decision from it).
        run.proc = started if started is not None and started.poll() is None else self._eval_process(run, trained)
        run.phase = "eval"
        if self.overlap and release:
            # Its GPUs go back now: the next job starts beside this evaluation (and waits at a gate for it).
            st.released = time.time()
            st.history[-1]["released"] = st.released
            self.packer.release(job.name)

    def _export_early(self, job: TaskJob) -> bool:
        """Whether `job`'s evaluation step may also export its model (early_export's rule), recorded and said;
        that step exports it only when the job ranks within the top-k so far (eval_step.export_if_ranked)."""
        st = self.states[job.name]
        now = time.time()
        waiting = len(self.packer.queue) + sum(job.name in blockers for _, blockers in
                                               [*self.gates.values(), *self.deferred.values()])
        others = {n: o.started + o.predicted_s - now for n, r in self.running.items()
                  if n != job.name and r.phase == "train" and (o := self.states[n]).started is not None
                  and o.predicted_s is not None}
        beside = early_export(self.spec.leaderboard.export_top, waiting, others, gpus_back_first=self.overlap)
        st.early_export = beside or ""
        if st.history:
            st.history[-1]["early_export"] = bool(beside)
        if beside:
            log.info("export %s early if it ranks in the top %d so far (%s)", job.name,
                     self.spec.leaderboard.export_top, beside, extra=SHOW)
        return beside is not None

    def _job_log(self, name: str) -> Path:
        return self.run_dir / name / RUN_FILES.logs / (RUN_FILES.fleet_log if self.states[name].kind == "task"
                                                        else RUN_FILES.stdout_log)

    def _trained_marker(self, name: str) -> Path:
        return self.run_dir / name / RUN_FILES.logs / RUN_FILES.trained

    def _evaluate_only(self, job: TaskJob | CommandJob, st: JobState) -> bool:
        """Training of this job ended well in an earlier attempt: run only its evaluation step."""
        if not self._trained_marker(job.name).is_file():
            return False
        path = self._job_log(job.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a", encoding="utf-8")
        f.write(f"=== musubi run: {job.name} attempt {st.attempts}: trained earlier, evaluation only ===\n")
        f.flush()
        run = _Running(job, None, "eval", f)  # type: ignore[arg-type]  # _start_eval sets the process
        self.running[job.name] = run
        self._start_eval(run, release=False)  # evaluation alone: the GPUs are its until it ends
        self._say(f"evaluate {job.name} (attempt {st.attempts}: its training ended well before)")
        return True

    def _failure_cause(self, name: str, run: _Running, code: int) -> str:
        """Why an attempt failed: job.json's cause, else what the log shows (OOM, NCCL), or a broken contract."""
        path = self._job_log(name)
        if run.phase == "eval":
            if jobs.NO_EVAL_JSON in jobs.attempt_log(path):
                return f"contract: external job wrote no {RUN_FILES.eval} to ${MUSUBI_JOB_DIR} ({self.run_dir / name})"
            reason = jobs.eval_error(path)
            if code == EXIT_CONFIG:  # the step refused its input (a ConfigError): the same files fail the same way again
                return f"evaluation: {reason or 'exit 2'}"
            return f"evaluation: exit {code}" + (f": {reason}" if reason else "")
        cause = jobs.failure_cause(self.run_dir / name, code)
        if self.states[name].kind == "command" and cause.startswith("exit "):  # no job.json: the log's own words
            cause = jobs.log_cause(path, code) or cause
        return cause

    # -- the loop --------------------------------------------------------------
    def run(self) -> dict[str, JobState]:
        """Place, start, watch and retry until every job is done or failed for good."""
        self.save_state()
        live = Live(self.table(), console=self.console, refresh_per_second=2,
                    transient=False) if self.console.is_terminal else None
        if live:
            live.start()
        stopped: FleetInterrupted | None = None
        with signals_flagged() as signals:
            try:
                while (self.packer.queue or self.running or self.deferred) and not signals:
                    self._open_gates()
                    for demand, gpus in self.packer.place():  # a signal now only notes itself: each
                        self._start(self.jobs[demand.name], gpus)  # job started is recorded, then stopped
                    if self.overlap:
                        self._prestart_evals()
                    if self.predicted is None and self.packer.plan is not None:
                        self._note_plan(self.packer.plan)
                    self.save_state()
                    time.sleep(0.5)
                    for name, run in list(self.running.items()):
                        code = run.proc.poll()
                        if code is None:
                            continue
                        self._finished(name, run, code)
                    if live:
                        live.update(self.table())
            finally:  # a signal, or a crash of the loop: no job outlives the fleet
                if live:
                    live.stop()
                if signals:
                    stopped = FleetInterrupted(signals[0])
                self._stop_running(stopped)
        self.save_state()
        if stopped is not None:
            raise stopped
        self._startup_summary()
        return self.states

    def _startup_summary(self) -> None:
        """One line per job: where its start-up went (fleet.json keeps the figures), and the fleet's mean."""
        firsts, on_gpu = [], []
        for name, st in self.states.items():
            if st.startup.get("to first step") is None:
                continue
            firsts.append(st.startup["to first step"])
            on_gpu.append(st.startup["start-up on the GPUs"])
            log.info("start-up of %s: %s", name, summary_line(st.startup, device_unit(self.kind)))
        if firsts:
            self._say(f"start-up per job: {sum(firsts) / len(firsts):.1f} s to the first step, "
                      f"{sum(on_gpu) / len(on_gpu):.1f} s of it on the {device_unit(self.kind)}s (mean of "
                      f"{len(firsts)}; per job and "
                      f"component in fleet.log and fleet.json)")

    def _stop_running(self, why: FleetInterrupted | None) -> None:
        """Interrupted (or crashed): end every running job's whole process tree; they become `interrupted`."""
        now = time.time()
        for name in list(self.deferred):  # placed, never spawned
            st = self.states[name]
            st.state, st.gpus, st.ended = "interrupted", [], now
            st.attempts = max(0, st.attempts - 1)
            st.interruptions += 1
            st.history[-1].update(ended=now, outcome="interrupted")
            self.packer.release(name)
        self.deferred.clear()
        self.gates.clear()
        if not self.running:
            return
        names = list(self.running)
        self._say(f"stopping {len(names)} job(s): {', '.join(names)}" + (f" ({why})" if why else ""))
        for r in self.running.values():
            stop_watching(r.samplers)
        stop_trees([p for r in self.running.values() for p in (r.proc, r.evaluator) if p is not None])
        now = time.time()
        for name, run in self.running.items():
            st = self.states[name]
            # An interruption is not a failure: the attempt is not counted against the retries.
            st.state, st.gpus, st.ended = "interrupted", [], now
            st.attempts = max(0, st.attempts - 1)
            st.interruptions += 1
            if st.history:
                st.history[-1].update(ended=now, outcome="interrupted")
            with contextlib.suppress(OSError):
                run.log_file.write(f"=== musubi run stopped this attempt ({why or 'error'}) ===\n")
                run.log_file.close()
            self.packer.release(name)
        self.running.clear()
        self.save_state()

    def _finished(self, name: str, run: _Running, code: int) -> None:
        st = self.states[name]
        job_dir = self.run_dir / name
        stop_watching(run.samplers)  # its training is over (its evaluation is not what sharing weighs)
        run.samplers = []
        if run.phase == "train" and code == 0:
            self._start_eval(run)
            return
        if run.evaluator is not None:  # training failed: the early evaluation step has nothing to evaluate
            stop_trees([run.evaluator], grace=2.0)
        run.log_file.close()
        del self.running[name]
        self.packer.release(name)
        st.ended = time.time()
        st.released = st.released or st.ended
        st.history[-1].update(released=st.released, ended=st.ended, outcome="done" if code == 0 else "failed")
        marks = marks_of(job_dir, st.started, st.ended)
        if st.history[-1].get("spawned"):
            marks["spawned"] = st.history[-1]["spawned"]
        st.startup = components(marks)
        recovered = jobs.absorb_job_record(st, job_dir, failed=code != 0 and run.phase == "train")
        if code == 0:
            st.state = "done"
            self.packer.done.add(name)
            self._remember(name, st)
            self._say(f"done {name} ({st.ended - (st.started or st.ended):.0f}s){recovered}")
            return
        cause = self._failure_cause(name, run, code)
        st.causes.append(cause)
        # A config error, a broken contract (exit 0, no eval.json), a defect (the same cause after a restart) or an
        # evaluation that refused its input (exit 2: the job's files are what they are) fails the same way every
        # time: no retry.
        deterministic = cause.startswith(("config", "contract", "defect")) or (run.phase == "eval" and code == EXIT_CONFIG)
        retry = st.attempts <= self.jobs[name].retries and not deterministic
        tail = jobs.log_tail(job_dir / RUN_FILES.logs / (RUN_FILES.fleet_log if st.kind == "task" else RUN_FILES.stdout_log), 8)
        self._say(f"failed {name} (attempt {st.attempts}): {cause}" + ("; retrying" if retry else ""))
        log.warning("failed %s: %s\n%s", name, cause, tail)
        if retry:
            st.state = "queued"
            job = self.jobs[name]
            self.packer.requeue(self._demand(job))
        else:
            st.state = "failed"
            for dep in self.packer.drop_dependents(name):
                self.states[dep].state = "failed"
                self.states[dep].causes.append(f"dependency {name!r} failed")
                self._say(f"failed {dep}: it waits for {name}, which failed")

    def _note_plan(self, plan: Any) -> None:
        """The first plan in fleet.json ("plan": how, predicted and declared makespan, predicted bars, seconds
        from the fleet's start) and on the console: bench/fleet.py compares it with what happened."""
        self.predicted = {"how": plan.how, "makespan_s": round(plan.makespan, 1),
                          "declared_s": round(plan.declared, 1), "started": time.time(), "share": plan.share,
                          "unshared_s": round(plan.unshared, 1) if plan.share else None,
                          "bars": [{"job": b.name, "width": len(b.gpus), "start": round(b.start, 1),
                                    "end": round(b.end, 1)} for b in plan.bars]}
        changed = [f"{b.name} on {len(b.gpus)}" for b in plan.bars if len(b.gpus) != self.jobs[b.name].gpus]
        log.info("plan: %s, predicted makespan %.0f s (declared widths and order: %.0f s)%s", plan.how,
                 plan.makespan, plan.declared, f"; widths chosen: {', '.join(changed)}" if changed else "",
                 extra=SHOW)

    def _remember(self, name: str, st: JobState) -> None:
        """A clean run (first attempt, no restart, no interruption) goes to the duration history."""
        if st.attempts != 1 or st.restarts or st.interruptions or st.started is None or st.ended is None:
            return
        if st.shared_with:  # its seconds and utilisation mix with the other job's: not this job's alone
            self._remember_shared(name, st)
            return
        try:
            # The GPUs' time: to the release (with machine.overlap the next job starts beside the evaluation).
            record_run(self.db, self.jobs[name], self.machine, self.kind, st.width, st.started,
                       st.released or st.ended, self.run_dir / name)
        except Exception as e:  # noqa: BLE001 - an unwritable store only costs the next run's estimate
            log.warning("duration history of %s not recorded: %s", name, e)

    def _remember_shared(self, name: str, st: JobState) -> None:
        """A clean run that shared its GPU: how many times slower it ran while shared, against its duration alone
        in the history (none known: nothing to compare, nothing kept). The plan believes it over the model."""
        est = self.estimates[name]
        if not est.from_history or 1 not in est.widths or st.started is None or st.ended is None:
            return
        end = st.released or st.ended
        partners = [self.states[p] for p in st.shared_with if p in self.states]
        # A partner still running shared the GPU to this job's end.
        overlap = overlap_s(st.started, end, [(o.started, o.released or o.ended or end) for o in partners
                                              if o.started is not None])
        try:
            slowed = record_shared_run(self.db, self.jobs[name], self.machine, self.kind, st.started, end,
                                       est.at(1), overlap, st.shared_with)
        except Exception as e:  # noqa: BLE001 - an unwritable store only costs the next plan's figure
            log.warning("shared run of %s not recorded: %s", name, e)
            return
        if slowed is not None:
            log.info("%s ran %.2fx slower while sharing its GPU with %s (%.0f s of %.0f s shared); kept for the "
                     "next plan", name, slowed, ", ".join(st.shared_with), overlap, end - st.started)

    def _say(self, text: str) -> None:
        if not self.console.is_terminal:
            self.console.print(text, highlight=False, markup=False)
        log.info("%s", text)

    # -- the live table ---------------------------------------------------------
    def table(self) -> Table:
        """Job, state, GPUs, epoch/step, samples/s, ETA, and the ranks flagged as stragglers now."""
        t = Table(title=Text(f"fleet {self.spec.name}"), expand=False)
        for col in ("job", "state", "GPUs" if self.kind == "cuda" else "CPU slots", "attempt", "restarts", "step",
                    "epoch", "samples/s", "ETA", "straggler"):
            t.add_column(col)
        for name, st in self.states.items():
            step = epoch = rate = eta = straggler = "-"
            metrics = self.run_dir / name / RUN_FILES.metrics
            if st.kind == "task" and metrics.is_file():
                rec = _last_train_record(metrics)
                if rec:
                    summary_total = rec.get("total_steps")
                    step = f"{rec['step']}/{summary_total}" if summary_total else str(rec["step"])
                    epoch = str(rec.get("epoch", "-"))
                    if rec.get("samples_per_s"):
                        rate = f"{rec['samples_per_s']:.1f}"
                    if summary_total and st.started and rec["step"] and st.state == "running":
                        left = (time.time() - st.started) / rec["step"] * (summary_total - rec["step"])
                        eta = f"{left:.0f}s"
            if st.kind == "task" and st.state == "running":  # rank 0's live flags (telemetry/stragglers.jsonl)
                straggler = describe(current_stragglers(self.run_dir / name / RUN_FILES.telemetry))
            held = ",".join(map(str, st.gpus)) if st.state in ("starting", "running", "evaluating") else "-"
            # Text cells: a name is never read as rich markup.
            t.add_row(*(Text(c) for c in (name, st.state, held, str(st.attempts), str(st.restarts), step, epoch,
                                          rate, eta, straggler)))
        return t


def _last_train_record(path: Path) -> dict[str, Any] | None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for ln in reversed(lines):
        try:
            rec = json.loads(ln)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and rec.get("kind") == "train" and isinstance(rec.get("step"), int):
            return rec
    return None
