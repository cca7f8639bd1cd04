"""One rank of a job in three phases: setup, train, finish (the entry, worker.py, runs them in one try).

- setup: the resolved job (`JOB_DIR/job.json`, written by the launcher), the process group, the fleet's
  GPU hand-over, this rank's log, the watchdog, the cores, the task, the precision and the batch;
- train: the Trainer, resumed where a checkpoint says, to the end or the stop point;
- finish: rank 0's summary and eval.json, then the teardown in the safe order.

A failure of training with a recovery of its own (an OOM, a non-finite loss) leaves its record and the
exit code that makes torchrun restart every rank with a smaller batch or a safer precision (`failed`);
anything else is the rank's crash (worker/exits.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
from pathlib import Path
from typing import Any

import psutil

from musubi.config.load import job_from_dict
from musubi.contract.env import MUSUBI_GATE, MUSUBI_GATE_PID, MUSUBI_LAUNCH
from musubi.contract.exits import EXIT_DEFECT, EXIT_NUMERICS, EXIT_OOM
from musubi.contract.inject import Injector
from musubi.contract.run_files import RUN_FILES
from musubi.contract.world import attempt_id, init_world, shutdown_world
from musubi.recovery.goodput import ProgressLog
from musubi.recovery.memory import is_oom, record_oom
from musubi.recovery.numerics import ends_job, record_nonfinite
from musubi.recovery.watchdog import Heartbeat, Watchdog
from musubi.store import startup
from musubi.tasks.registry import build_task
from musubi.worker.batching import decide_batch
from musubi.worker.devices import check_unique_devices
from musubi.worker.exits import RankEnd, crashed, write_error
from musubi.worker.fork_guard import quiet_forks
from musubi.worker.log_window import NonFiniteLoss
from musubi.worker.pinning import OVERSUBSCRIBED, Pinning, configure_threads
from musubi.worker.plan_record import write_plan_record
from musubi.worker.precision import resolve_precision
from musubi.worker.reporting import MetricsWriter, setup_logging
from musubi.worker.restarts import log_gap, reap_after_restart, restart_precision, stop_on_repeat
from musubi.worker.summary import write_summary
from musubi.worker.trainer import RunOptions, Trainer, build_optimizer

log = logging.getLogger("musubi.worker")


def wait_for_gate() -> bool:
    """Wait until the fleet hands this job its GPUs; False at once when no gate was set.

    The fleet starts a job while the previous job on its GPUs still evaluates (MUSUBI_GATE names the
    file it writes when that evaluation ends): imports, torchrun, rendezvous and the process group
    overlap that tail, and the model is built only on free GPUs. MUSUBI_GATE_PID is the fleet's pid: a
    fleet that died never opens the gate, so the wait ends with an error instead of forever."""
    gate = os.environ.get(MUSUBI_GATE)
    if not gate:
        return False
    owner = int(os.environ.get(MUSUBI_GATE_PID, "0") or 0)
    path = Path(gate)
    if not startup.wait_for_file(path, lambda: not owner or psutil.pid_exists(owner)):
        raise RuntimeError(f"the fleet (pid {owner}) that was to open {path} is gone")
    return True


class Rank:
    """One rank's run of one job: setup(), train(), finish(); failed(e) for a failure of any of them."""

    def __init__(self, args: argparse.Namespace, rank: int, restarts: int, pinned: Pinning | None,
                 t_start: float) -> None:
        self.args, self.rank, self.restarts, self.pinned, self.t_start = args, rank, restarts, pinned, t_start
        self.job_dir: Path = args.job_dir
        self.trainer: Trainer | None = None
        #: Failures of the train phase may have recoveries of their own (a smaller batch, a safer precision).
        self.training = False
        self.summary: dict[str, Any] = {}  # the Trainer's, once fit() returned

    def mark(self, name: str) -> None:
        """A start-up mark (store/startup.py), written by rank 0 only."""
        if self.rank == 0:
            startup.mark(self.job_dir, name)

    # -- setup -------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Read the job, join the world, start the watchdog, build the task and decide the batch."""
        self.read_job()
        self.join_world()
        self.start_watchdog()
        check_unique_devices(self.world)  # abort at start if two ranks share one GPU
        self.use_cores()
        if self.restarts:
            reap_after_restart(self.job_dir, self.restarts)  # a killed rank's checkpoint process outlives it
        self.build_task()
        self.decide_batch()

    def read_job(self) -> None:
        """The resolved job the launcher wrote, and the faults to inject into this rank."""
        path = self.job_dir / RUN_FILES.job
        self.record = json.loads(path.read_text(encoding="utf-8"))
        self.spec = job_from_dict(self.record["config"], source=str(path))
        self.launch = int(self.record.get("attempts", 1))
        self.injector = Injector.from_env(self.rank, self.job_dir / RUN_FILES.inject)
        self.mark("imported")

    def join_world(self) -> None:
        """The process group, the fleet's GPU hand-over, this rank's log; a repeated failure ends the rank here."""
        self.world = world = init_world(self.spec.train.timeout_s)
        self.mark("world")
        if wait_for_gate():
            self.mark("gate")
        self.console = setup_logging(world, self.job_dir / RUN_FILES.logs)
        if quiet_forks():  # gloo's threads now exist: forks wait for them to sleep (fork_guard.py)
            log.info("forks wait for a quiet rank (Python %s: python/cpython#112275)", platform.python_version())
        if self.restarts >= 2:
            defect = stop_on_repeat(self.job_dir, world, self.launch, self.restarts)
            if defect is not None:
                if world.is_main:
                    log.error("%s", defect)
                write_error(self.job_dir, self.rank, "defect", defect)
                shutdown_world()
                raise RankEnd(EXIT_DEFECT)

    def start_watchdog(self) -> None:
        """This rank's heartbeat and watchdog thread (hang detection), and rank 0's goodput progress log."""
        spec, world = self.spec, self.world
        os.environ[MUSUBI_LAUNCH] = str(self.launch)
        self.progress = ProgressLog(self.job_dir, attempt_id(), self.t_start) if world.is_main else None
        self.heartbeat = Heartbeat(progress=self.progress)
        watch = spec.watchdog
        if not watch.enabled:  # still publish heartbeats and progress (goodput), never judge
            watch = watch.model_copy(update={"floor_s": 86_400.0})
        self.watchdog = Watchdog(self.job_dir, world.rank, world.size, watch, float(spec.train.timeout_s),
                                 self.heartbeat)
        self.watchdog.start()

    def use_cores(self) -> None:
        """Loader workers and torch's intra-op threads from this rank's cores (or the config)."""
        self.workers_from = {"auto": "auto (this rank's cores)", None: "default (2, fitted to this rank's cores)"}.get(
            self.spec.data.workers, "config")
        threads = configure_threads(self.spec, self.pinned)
        log.log(logging.WARNING if OVERSUBSCRIBED in threads else logging.INFO, "rank %d: %s", self.world.rank,
                threads)

    def build_task(self) -> None:
        """The task on this rank's device, checked, and the precision in force (safer after a non-finite loss)."""
        spec, world = self.spec, self.world
        log.info("building the model, optimizer and data loaders (%s, %s)...", spec.task, spec.model_label())
        self.task = build_task(spec)
        self.task.use_device(world.device)  # before the data sets: `data.gpu_decode: auto` decides on it
        self.task.validate()
        self.precision = resolve_precision(spec.train.precision, world.device)
        if self.restarts:
            self.precision = restart_precision(self.job_dir, world, self.precision)
            spec.train.precision = self.precision  # the Trainer reads it from the spec

    def decide_batch(self) -> None:
        """The batch plan (probed, cached or configured) and its record; --probe-only ends the rank here."""
        spec, world = self.spec, self.world
        self.plan, _recoveries = decide_batch(spec, self.task, world, self.job_dir, self.precision, self.injector,
                                              lambda m: build_optimizer(m, spec, 1e-3))
        self.mark("batch")
        write_plan_record(self.job_dir, spec, self.task, world, self.plan, self.precision)
        if self.args.probe_only:
            plan = self.plan
            if world.is_main:
                print(json.dumps({"per_rank_batch": plan.per_rank, "global_batch": plan.global_batch,
                                  "lr": plan.lr, "source": plan.source}), flush=True)
            self.watchdog.stop()
            shutdown_world()
            raise RankEnd(0)

    # -- train -------------------------------------------------------------------------------------
    def train(self) -> None:
        """Build the Trainer, resume where a checkpoint says, and train to the end or the stop point."""
        self.training = True
        args, world = self.args, self.world
        # A torchrun restart (and --resume-if-any: a --resume of a run stopped before its first checkpoint) resumes
        # when an intact checkpoint exists (Trainer.resume checks checksums) and otherwise starts from step 0; only
        # the user's --resume insists on one.
        opts = RunOptions(resume=args.resume or args.resume_if_any or self.restarts > 0, stop_at_step=args.stop_at_step)
        self.trainer = trainer = Trainer(self.spec, self.task, world, self.job_dir, opts, self.console,
                                         plan=self.plan, injector=self.injector, heartbeat=self.heartbeat)
        quiet_forks(trainer.checkpointer.wait)  # and, from the main thread, for the save in flight
        self.mark("model")
        if opts.resume:
            trainer.resume(automatic=not args.resume)
        self.mark("fit")
        if self.restarts and world.is_main:
            log_gap(self.job_dir, self.restarts, trainer.step)
        metrics = None
        try:
            metrics = MetricsWriter(self.job_dir, trainer.step if opts.resume else None, self.spec.tracking,
                                    self.spec.name, self.record["config"]) if world.is_main else None
            self.summary = trainer.fit(metrics)
            self.mark("trained")
        finally:
            if metrics is not None:
                metrics.close()

    # -- finish ------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Rank 0 writes the summary and eval.json; every rank stops its watchdog and leaves in the safe order."""
        trainer, summary = self.trainer, self.summary
        if self.world.is_main:
            write_summary(self.job_dir, summary, self.plan, self.restarts, trainer, self.task,
                          self.workers_from)
        if self.progress is not None:
            self.progress.end(trainer.step)
        self.watchdog.stop()
        trainer.close()
        self.trainer = None
        # DDP sits in reference cycles (reducer hooks): collect it now, while the
        # process group still exists, or gloo may hang or abort at exit.
        gc.collect()
        shutdown_world()

    # -- failures ----------------------------------------------------------------------------------
    def failed(self, exc: Exception) -> int:
        """Record `exc` and return the exit code: an OOM or a non-finite loss of training restarts every rank
        (a smaller batch, a safer precision); anything else is a crash or bad input (worker/exits.py)."""
        if self.training and isinstance(exc, FloatingPointError):
            return self.nonfinite(exc)
        if self.training and is_oom(exc):
            return self.out_of_memory(exc)
        return crashed(self.job_dir, self.rank, exc)

    def nonfinite(self, exc: FloatingPointError) -> int:
        """Every rank saw the same non-finite all-reduced loss at the same step (see numerics.py): roll back."""
        trainer, precision = self.trainer, self.precision
        # a log line's loss is read up to an interval after its step: the step is the line's, not the loop's
        step = exc.step if isinstance(exc, NonFiniteLoss) else trainer.step if trainer is not None else 0
        last_good = trainer.last_finite_step if trainer is not None else 0
        if ends_job(self.job_dir, step, precision):  # fp32: retried once at this step already
            return crashed(self.job_dir, self.rank, nothing_safer(exc))
        record_nonfinite(self.job_dir, self.world.rank, step, last_good, precision, str(exc))
        write_error(self.job_dir, self.rank, "numerics", f"{exc} in {precision}: rolling back to step <= "
                    f"{last_good} in a safer precision (fp32: the same, once)")
        log.error("%s in %s: restarting from the last good checkpoint in a safer precision", exc, precision)
        logging.shutdown()
        return EXIT_NUMERICS

    def out_of_memory(self, exc: Exception) -> int:
        """Peers may be inside a collective this rank will never join: record, leave at once, and let torchrun
        restart every rank with the smaller batch (see memory.py)."""
        trainer, plan, world = self.trainer, self.plan, self.world
        step = trainer.step + 1 if trainer is not None else 1
        phase = trainer.phase if trainer is not None else "setup"
        done = trainer.step - trainer.fit_start_step if trainer is not None else 0
        record_oom(self.job_dir, world.rank, step, phase, plan.per_rank, plan.accumulation, world.device, str(exc),
                   steps_done=done)
        write_error(self.job_dir, self.rank, "oom", f"out of memory in {phase} at step {step} "
                    f"(per-rank batch {plan.per_rank}): {exc}")
        log.error("out of memory in %s at step %d (per-rank batch %d): restarting all ranks", phase, step,
                  plan.per_rank)
        logging.shutdown()
        return EXIT_OOM


def nothing_safer(exc: FloatingPointError) -> FloatingPointError:
    """A non-finite loss in fp32 again at the step an fp32 retry started from, raised here so its record names
    where (a repeat at this line is a defect)."""
    try:
        raise FloatingPointError(f"{exc} in fp32 again after a rollback to the last good checkpoint (nothing safer "
                                 "to fall back to): lower train.lr, add train.grad_clip or check the data") from None
    except FloatingPointError as fatal:
        return fatal
