"""The training loop of one rank: batches in, optimizer steps, logs, evaluation, checkpoints."""

from __future__ import annotations

import gc
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from musubi.checkpoint import checkpoint as ckpt
from musubi.checkpoint.checkpoint import agree_buffers
from musubi.checkpoint.saver import Checkpointer
from musubi.checkpoint.states import CheckpointStates
from musubi.config.batch_plan import BatchPlan, lr_line, plan_batch
from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.contract.inject import Injector
from musubi.contract.run_files import RUN_FILES
from musubi.contract.world import World
from musubi.recovery.memory import memory_figures
from musubi.recovery.watchdog import Heartbeat
from musubi.store.startup import mark
from musubi.tasks.base import Task
from musubi.tasks.data_line import describe_data
from musubi.worker.bn_stats import recalibrate_bn, restore_bn, snapshot_bn
from musubi.worker.early_stop import EarlyStop
from musubi.worker.feed.loaders import TrainFeed, ValFeed
from musubi.worker.log_window import LogWindow, PendingLine, agree_parts, check_finite, queue_line
from musubi.worker.ordered_reduce import needs_ordered_reduce, ordered_allreduce_hook
from musubi.worker.precision import autocast, make_scaler, resolve_precision
from musubi.worker.reporting import MetricsWriter, ProgressBar, console_interval, log_interval
from musubi.worker.rng import RankRng, capture_rng, restore_rng
from musubi.worker.save_cadence import AutoCadence
from musubi.worker.schedule import lr_factor
from musubi.worker.step_events import (
    AFTER_BACKWARD,
    BEFORE_BACKWARD,
    BEFORE_FORWARD,
    BEFORE_OPTIMIZER,
    EPOCH_END,
    FIT_START,
    LOSS,
    PHASE,
    STEP_END,
    FirstStepMarks,
    InjectionHooks,
    StepEvents,
    attach_heartbeat,
    attach_telemetry,
)
from musubi.worker.telemetry_session import open_telemetry
from musubi.worker.wrap import (
    eval_module,
    gradient_sync,
    needs_lockstep_eval,
    unwrap,
    wrap_model,
)

log = logging.getLogger("musubi.trainer")


@dataclass
class RunOptions:
    """Launcher-side choices that are not part of the job: resume, a stop point."""

    resume: bool = False
    stop_at_step: int | None = None


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices) alike."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def configure_determinism(deterministic: bool, world: World) -> None:
    """Deterministic kernels (exact resume) or the fastest ones (cudnn autotuning)."""
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    if deterministic:
        # warn_only: some CUDA kernels (e.g. detection's roi_align backward) have no
        # deterministic version; torch warns for them instead of failing the run.
        torch.use_deterministic_algorithms(True, warn_only=True)


def settle_heap() -> None:
    """Collect the garbage of setup (or of a validation), then freeze what lives on out of the collector's reach.

    A rank holds hundreds of thousands of long-lived Python objects (torch, the task's libraries, the model's
    modules); a full (generation-2) collection walks them all. One inside a training block stalls the step for
    about as long as the once-a-run stall seen at 4 GPUs, where every rank waits for the paused one
    (bench/loop_ab.py, BENCHMARKS.md: training loop). Frozen objects are still
    freed by reference counting; only cycles among them are left, until fit() ends and unfreezes
    (gc.unfreeze): a process that trains more than once (tests, the API) gets its cycles collected again. The
    data loader's workers, forked after it, also share more memory pages (CPython's gc.freeze docs).

    The collector is on afterwards, whoever turned it off: a rank's start-up runs without it (worker.main), the
    training loop never does.
    """
    gc.collect()
    gc.freeze()
    gc.enable()


def build_optimizer(model: torch.nn.Module, spec: JobSpec, lr: float) -> torch.optim.Optimizer:
    """SGD or AdamW over the (possibly sharded) parameters."""
    t = spec.train
    params = [p for p in model.parameters() if p.requires_grad]
    if t.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(t.momentum, 0.999), weight_decay=t.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=t.momentum, weight_decay=t.weight_decay)


class Trainer:
    """One rank's training of one job."""

    def __init__(self, spec: JobSpec, task: Task, world: World, job_dir: Path, opts: RunOptions,
                 console: Any = None, plan: BatchPlan | None = None, injector: Injector | None = None,
                 heartbeat: Heartbeat | None = None) -> None:
        self.spec, self.task, self.world, self.job_dir, self.opts = spec, task, world, job_dir, opts
        self.hb = heartbeat or Heartbeat()  # read by the watchdog thread (hang detection, goodput)
        self.console = console
        t = spec.train
        self.precision = resolve_precision(t.precision, world.device)
        self.plan = plan or plan_batch(spec, world.size)
        self.injector = injector or Injector(None, world.rank, None)
        configure_determinism(t.deterministic, world)
        seed_everything(t.seed)  # same init on every rank (DDP also broadcasts rank 0's weights)

        model = task.build_model()
        self.signature = ckpt.model_signature(model)
        if t.channels_last:
            model = model.to(memory_format=torch.channels_last)
        model.to(world.device)
        self.model = wrap_model(model, t.strategy, world)
        self.optimizer = build_optimizer(self.model, spec, self.plan.lr)

        self.feed = TrainFeed(task, world, self.plan.per_rank, t.seed, spec.data.workers, spec.data.pin_memory,
                              nhwc=t.channels_last)
        if self.injector:  # `data_stall` sleeps in the wait for the batch: the `data` section
            self.feed.before_batch = self.injector.data_delay
        self.val = ValFeed(task, world, self.plan.per_rank, spec.data.workers, spec.data.pin_memory)
        if world.is_main and spec.own_data:  # no data: section to say it: the samples the task's datasets hold
            log.info("data: %s", describe_data(spec, {"train": self.feed.dataset_size, "val": self.val.size}))
        self.steps_per_epoch = self.feed.micro_per_epoch // self.plan.accumulation
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"{self.feed.micro_per_epoch} micro-batches per epoch < train.accumulation={t.accumulation}; "
                "lower accumulation or batch, or add data"
            )
        #: Micro-batches of an epoch that fill whole optimizer steps (the rest are left over).
        self.usable_micro = self.steps_per_epoch * self.plan.accumulation
        total = self.steps_per_epoch * t.epochs
        self.total_steps = min(total, t.max_steps) if t.max_steps else total
        #: Where this process stops: the end of training, or an earlier stop point (--max-steps).
        self.stop_step = min(self.total_steps, opts.stop_at_step or self.total_steps)
        #: Steps between console lines in a pipe (a terminal has the bar): the log interval the user wrote, else
        #: a few lines over a short run (reporting.console_interval).
        self.console_every = t.log_every or 0
        if t.log_every is None:  # unset: from the run's length (reporting.log_interval), for every reader of the spec
            t.log_every = log_interval(self.total_steps)
            self.console_every = console_interval(self.total_steps, t.log_every)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(t.warmup_steps, self.total_steps, t.schedule)
        )
        self.scaler = make_scaler(self.precision, world.device)
        self.ckpt_root = job_dir / RUN_FILES.checkpoints
        ordered = ordered_allreduce_hook if needs_ordered_reduce(t.deterministic, world.size, t.strategy) else None
        #: This rank's span recorder (telemetry/rank{r}.jsonl; the checkpointer appends its records there too).
        self.telemetry = open_telemetry(spec, world, job_dir, self.model, self.feed, reduce=ordered)
        if ordered is not None and not self.telemetry.enabled and isinstance(self.model, DDP):
            self.model.register_comm_hook(None, ordered)  # telemetry off: no timing hook wraps it
        #: What a checkpoint holds, handed over once: the checkpointer saves and loads these in place by step.
        self.states = CheckpointStates(model=self.model, optimizer=self.optimizer, train=self,
                                       rank=RankRng(world.device), signature=self.signature,
                                       scheduler=self.scheduler, scaler=self.scaler)
        self.checkpointer = Checkpointer(self.ckpt_root, spec.checkpoint, world, self.injector, self.states,
                                         task.primary_metric, self.telemetry.path, validated=bool(self.val))
        #: checkpoint.every_steps auto: the interval rank 0 measures and chooses, every rank agrees on (save_cadence.py).
        self.cadence = AutoCadence(spec.checkpoint, world, job_dir, self.checkpointer, self.steps_per_epoch,
                                   self.model, self.optimizer) \
            if spec.checkpoint.every_steps == "auto" and self.checkpointer.enabled else None
        # The step's listeners (step_events.py); fit adds its own (the log line, checkpoint cadence) after these.
        self.events = StepEvents()
        attach_telemetry(self.events, self.telemetry)
        attach_heartbeat(self.events, self.hb)
        if self.injector:
            InjectionHooks(self.injector, unwrap(self.model), world.device, task.batch_size_of).attach(self.events)
        self.phase = "setup"
        # Training-time randomness (dropout, augmentation on device) differs per rank.
        torch.manual_seed(t.seed * 1000 + world.rank + 1)
        self.step = 0
        self.fit_start_step = 0
        self.last_finite_step = 0  # the last log interval whose all-reduced loss was finite (numerics.py)
        self.epoch = 0
        self.micro = 0  # micro-batches of the current epoch already consumed
        self.last_eval: dict[str, float] = {}
        self.last_eval_step = -1  # the step whose weights `last_eval` measured
        self.window = LogWindow(world.device)  # what the next log line averages
        self.pending_line: PendingLine | None = None  # the last log step's line, not yet read (log_window.py)
        self.metrics: MetricsWriter | None = None  # rank 0's sink (metrics.jsonl) and bar, set by fit
        self.bar: ProgressBar | None = None
        #: train.early_stop: patience on a validation metric (rank 0's value decides on every rank), or None.
        self.early = EarlyStop.from_spec(t.early_stop, task.primary_metric) if t.early_stop else None
        if self.early is not None and not self.val:
            raise ConfigError("train.early_stop watches a validation metric and this task has no validation set; "
                              "give it one or remove train.early_stop")

    @property
    def phase(self) -> str:
        """Where this rank is (forward, backward, ...): the watchdog's progress signal."""
        return self.hb.phase

    @phase.setter
    def phase(self, value: str) -> None:
        self.events.fire(PHASE, value)

    # -- state ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything global (same on all ranks) needed to continue exactly, beside the scheduler's and the
        scaler's own (the checkpointer stores them with it: checkpoint/states.py)."""
        return {
            "step": self.step,
            "epoch": self.epoch,
            # Data position in samples of this rank (not micro-batches): stays valid when an OOM
            # recovery changes the micro-batch size.
            "samples": self.micro * self.plan.per_rank,
            "signature": self.signature,
            "task": self.spec.task,
            "model": self.spec.model,
            # The output classes in label order: a checkpoint says what its weights name (export and predict).
            "classes": self.task.class_names(),
            "global_batch": self.plan.global_batch,
            "last_eval": self.last_eval,
            "last_eval_step": self.last_eval_step,
            # The patience count: a resumed run stops where one that never stopped would.
            "early_stop": self.early.state_dict() if self.early is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's global state (ConfigError: a data position this batch cannot continue)."""
        if state.get("global_batch") != self.plan.global_batch:
            log.warning("global batch changed since the checkpoint (%s -> %s): the resume is not exact",
                        state.get("global_batch"), self.plan.global_batch)
        # The data position is kept in samples of this rank, not micro-batches: it stays valid when an OOM
        # recovery changes the micro-batch size.
        samples, per_rank = int(state["samples"]), self.plan.per_rank
        if samples % per_rank:
            raise ConfigError(f"data position {samples} is not a whole number of batches of {per_rank}; resume "
                              "with the batch it was written with")
        self.step, self.epoch, self.micro = state["step"], state["epoch"], samples // per_rank
        self.last_eval, self.last_eval_step = state.get("last_eval", {}), int(state.get("last_eval_step", -1))
        early = state.get("early_stop")
        if self.early is not None and early:
            if not self.early.load_state_dict(early):
                log.warning("train.early_stop watches %s (%s), the checkpoint's count watched %s (%s): counting "
                            "afresh", self.early.metric, self.early.mode, early.get("metric"), early.get("mode"))
            elif self.early.stopped_step is not None:  # a restart after the stop's own checkpoint: nothing to train
                self.stop_step = min(self.stop_step, self.step)

    def save(self) -> None:
        """Collective checkpoint of the current state (asynchronous unless checkpoint.async_mode is off)."""
        if not self.checkpointer.enabled:
            return
        self.flush_line()  # a non-finite loss of the last interval read stops the run before it is saved
        self.phase = "checkpoint"
        t_save = self.cadence.saving(self.step) if self.cadence is not None else 0.0
        # keep_best ranks a checkpoint by the evaluation of its own weights, never an earlier step's.
        self.checkpointer.save(self.step, metric=self.last_eval if self.last_eval_step == self.step else {},
                               last=self.step >= self.stop_step)
        if self.cadence is not None:  # every rank saves at the same steps: the next interval is agreed here
            self.cadence.saved(self.step, t_save)

    def flush_checkpoint_records(self) -> None:
        """Finished saves (time the step was blocked, time to durable) into metrics.jsonl (rank 0)."""
        metrics = self.metrics
        for rec in self.checkpointer.drain():
            if metrics is not None:
                step = rec.pop("step")
                metrics.write(step, rec, kind="checkpoint")

    def resume(self, automatic: bool = False) -> bool:
        """Continue from the newest good committed checkpoint (the checkpointer finds, verifies and loads it).

        `automatic` (a torchrun restart, not the user's --resume): with no intact checkpoint, train
        from step 0 and return False instead of failing.
        """
        got = self.checkpointer.load(automatic=automatic)
        if got is None:
            return False
        self.hb.resumed_step = self.step
        self.hb.step = self.step
        log.info("resumed from %s: step %d, epoch %d, micro-batch %d", got.path.name, self.step, self.epoch,
                 self.micro)
        return True

    # -- evaluation ----------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """One validation pass over this rank's shard; global metrics on every rank.

        Training's random streams are put back afterwards: a loader iterator draws its workers'
        seed from the global torch RNG, so an evaluation (e.g. the one at a `--max-steps` stop)
        would otherwise shift every later random draw, and a run validated at other steps would
        no longer be the same run (the resume matrix caught it: a stop-and-resume run's RNG
        state differed from the uninterrupted run's from the stop on).
        """
        if not self.val:
            return {}
        rng = capture_rng(self.world.device)
        try:
            return self._evaluate()
        finally:
            restore_rng(rng, self.world.device)

    def _evaluate(self) -> dict[str, float]:
        # Every rank scores its shard with the same running statistics (rank 0's): each holds its own
        # last batch's until DDP's next forward, and FSDP2 never broadcasts them.
        agree_buffers(self.model, self.world)
        net = eval_module(self.model)
        # BatchNorm statistics at these weights (worker/bn_stats.py says why). A stop point that a resume continues
        # from (--max-steps) gives them back afterwards: the resumed run stays the uninterrupted one.
        t0 = time.perf_counter()  # eval_s: the recalibration is part of the validation's time
        n_bn = self.spec.train.bn_recalibrate
        stop = self.opts.stop_at_step
        stop_point = stop is not None and stop <= self.step < self.total_steps  # not an early stop: that one ends the run
        trained_bn = snapshot_bn(net) if n_bn and stop_point else None
        if n_bn:
            with autocast(self.precision, self.world.device):
                recalibrate_bn(net, self.feed.calibration_batches(n_bn), self.task.loss, self.world)
        net.eval()
        metric = self.task.make_metric(self.world.device)
        n_local = len(self.val)
        # FSDP's forward is a collective: ranks with fewer batches repeat their last
        # one (results discarded) so every rank runs the same number of forwards.
        n_forward = self.world.all_reduce_max(n_local) if needs_lockstep_eval(self.model) else n_local
        last = None
        it = self.val.batches()
        for i in range(n_forward):
            real = i < n_local
            batch = next(it) if real else last
            if batch is None:  # this rank has no validation sample at all: nothing to pad with
                break
            with autocast(self.precision, self.world.device):
                out = self.task.predict(net, batch)
            if real:
                metric.update(out, batch)
                last = batch
        values = metric.compute(self.world.all_reduce_sum)
        if trained_bn is not None:
            restore_bn(net, trained_bn)
        net.train()
        values["eval_s"] = round(time.perf_counter() - t0, 3)
        return values

    # -- the loop --------------------------------------------------------------
    def fit(self, metrics: MetricsWriter | None) -> dict[str, Any]:
        """Train to the end (or the stop point); return a summary. Once per Trainer."""
        self._announce()
        self.model.train()
        bar = ProgressBar(self.console, self.total_steps, self.step, self.spec.name)
        self.metrics, self.bar = metrics, bar
        t_start, step_start = time.perf_counter(), self.step
        self.window.restart(t_start)
        self.fit_start_step = self.step
        self.last_finite_step = self.step  # a resumed checkpoint's state was good
        # After the injection, heartbeat and telemetry hooks: a step is logged, then saved if due.
        self.events.on(STEP_END, self.log_step)
        self.events.on(STEP_END, self.save_after_step)
        self.events.on(EPOCH_END, self.save_at_epoch_end)
        if self.cadence is not None:
            self.cadence.start(self.step)
            self.events.on(EPOCH_END, self.cadence.pause)  # a validation's time is no step's
        if self.world.is_main:
            FirstStepMarks(self.job_dir, self.world.device, self.step + 1).attach(self.events)
        self.events.fire(FIT_START, self.step)
        try:
            settle_heap()
            while self.epoch < self.spec.train.epochs and self.step < self.stop_step:
                batches = self.telemetry.timed(self.feed.epoch(self.epoch, self.micro))
                while self.step < self.stop_step and self.train_step(batches):
                    pass
                self.end_epoch()
            self.phase = "finish"
            self.flush_line()
            self.checkpointer.wait()  # the last checkpoint is durable and committed before the summary
            self.flush_checkpoint_records()
        finally:
            bar.close()
            gc.unfreeze()
        elapsed = time.perf_counter() - t_start
        return {
            "steps": self.step,
            "total_steps": self.total_steps,
            # An early stop ends the job as its last step would: nothing is left to resume.
            "finished": self.step >= self.total_steps or self.stopped_early,
            "epoch": self.epoch,
            "global_batch": self.plan.global_batch,
            "lr": self.plan.lr,
            "precision": self.precision,
            "world_size": self.world.size,
            "train_s": round(elapsed, 3),
            "steps_per_s": round((self.step - step_start) / max(elapsed, 1e-9), 4),
            "val": self.last_eval,
            **({"early_stop": self.early.record()} if self.early is not None else {}),
        }

    def _announce(self) -> None:
        t, plan = self.spec.train, self.plan
        log.info(
            "global batch %d = %d per rank x %d ranks x %d accumulation; precision %s; strategy %s; %d steps "
            "(%d per epoch)", plan.global_batch, plan.per_rank, plan.world, plan.accumulation, self.precision,
            t.strategy, self.total_steps, self.steps_per_epoch,
        )
        # A line of its own: the LR is rescaled with the global batch, and a surprising one must be seen.
        log.info("%s", lr_line(plan.lr, t.lr, t.base_batch, plan.global_batch, t.lr_rule))
        if self.step < self.stop_step:  # the first step also starts the loader workers: the next line is step log_every's
            workers = getattr(getattr(self.feed, "plan", None), "workers", 0)  # none: the rank reads its own batches
            log.info("first step (%swarm-up)...", "loader workers start, " if workers else "")

    def train_step(self, batches: Iterator[Any]) -> bool:
        """One optimizer step over the next micro-batches of `batches`; False: the epoch holds no further step."""
        for batch in batches:
            if self.micro >= self.usable_micro:
                return False  # leftover micro-batches that do not fill an optimizer step
            sync = (self.micro + 1) % self.plan.accumulation == 0
            loss, parts = self.forward_backward(batch, sync)
            self.window.add(loss, self.task.batch_size_of(batch) * self.world.size, parts)
            self.micro += 1
            if sync:
                self.optimizer_step()
                self.events.fire(STEP_END, self.step)
                return True
        return False

    def end_epoch(self) -> None:
        """Validate where an epoch ended (or training stopped inside one), then fire epoch_end."""
        inside = self.step >= self.stop_step and self.micro < self.usable_micro
        if inside:
            # Training ended inside an epoch (train.max_steps, --max-steps): the weights it leaves are validated
            # like an epoch's end, so eval.json always has the final step's metrics.
            due = bool(self.val) and self.last_eval_step != self.step
        else:
            self.epoch += 1
            self.micro = 0
            due = self._eval_due(self.epoch)
        if due:
            self.run_eval()
            if not inside:
                self.watch_patience()
        self.events.fire(EPOCH_END, self.epoch)

    # -- the step: forward/backward of one micro-batch, then the optimizer ---------
    def forward_backward(self, batch: Any, sync: bool) -> tuple[torch.Tensor, dict[str, Any]]:
        """Loss of one micro-batch (and its named parts, for the log) and its scaled gradients (all-reduced only
        when `sync`)."""
        step = self.step + 1  # the optimizer step this micro-batch belongs to
        self.phase = "forward"
        self.events.fire(BEFORE_FORWARD, step, batch)
        with gradient_sync(self.model, sync):
            with autocast(self.precision, self.world.device):
                loss, parts = self.task.loss(self.model, batch)
            loss = self.events.pipe(LOSS, loss, step)
            self.phase = "backward"
            self.events.fire(BEFORE_BACKWARD, step)
            try:
                self.scaler.scale(loss / self.plan.accumulation).backward()
            finally:
                self.events.fire(AFTER_BACKWARD, step)
        return loss, parts

    def optimizer_step(self) -> None:
        """Clip, step, zero the gradients, advance the LR schedule: one optimizer step is done."""
        self.phase = "optimizer"
        self.events.fire(BEFORE_OPTIMIZER, self.step + 1)
        if self.spec.train.grad_clip:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.train.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1

    # -- the trainer's own step_end / epoch_end listeners ------------------------
    def log_step(self, step: int) -> None:
        """A log step queues its line (loss all-reduced, copied to the host without waiting) and writes the one
        before it; other steps move the bar. log_window.py says why the line is read an interval late."""
        t, w, win = self.spec.train, self.world, self.window
        due = step % t.log_every == 0 or step == self.stop_step
        if step == self.fit_start_step + 1:
            # The first step warmed the kernels (cudnn autotuning, allocator, loader workers): samples/s is
            # timed from its end, not from the cold start (one sync per fit), and its end is a start-up mark.
            if w.is_cuda:
                torch.cuda.synchronize(w.device)
            if w.is_main:
                mark(self.job_dir, "first_step")
            self.agree_loss_parts()
            if not due:
                win.restart(time.perf_counter())
        if self.bar is not None:
            self.bar.update(step)
        if not due:
            return
        self.phase = "log"
        # this interval's memory peak, read now: the allocator's counters are the host's, no sync
        values = {"lr": self.scheduler.get_last_lr()[0], "epoch": self.epoch, "total_steps": self.total_steps,
                  **self._memory_record()}
        earlier, self.pending_line = self.pending_line, queue_line(win, step, w.size, w.all_reduce_sum,
                                                                   time.perf_counter(), values)
        if earlier is not None:
            self.write_line(earlier)
        if step >= self.stop_step:
            self.flush_line()
        self.flush_checkpoint_records()

    def agree_loss_parts(self) -> None:
        """The ranks agree once, at the first step, on the loss parts they log (the log line's all-reduce needs
        the same parts everywhere); any disagreement, and every rank logs the total alone."""
        names = self.window.part_names
        if not agree_parts(self.window, self.world.all_reduce_min, self.world.all_reduce_max) and self.world.is_main:
            log.warning("loss parts differ between ranks (rank 0: %s): only the total loss is logged",
                        ", ".join(names or ()) or "none")

    def flush_line(self) -> None:
        """Write the queued log line now (waits for its copy): before a checkpoint, a validation, the end."""
        line, self.pending_line = self.pending_line, None
        if line is not None:
            self.write_line(line)

    def write_line(self, line: PendingLine) -> None:
        """A log line's record and console line; NonFiniteLoss (a FloatingPointError) for a NaN or inf loss."""
        mean_loss = line.mean_loss()
        check_finite(mean_loss, line.step)
        self.last_finite_step = line.step
        metrics, bar = self.metrics, self.bar
        if metrics is not None:
            parts = {k: round(v, 6) for k, v in line.mean_parts().items()}
            metrics.write(line.step, {"loss": round(mean_loss, 6), **parts,
                                      "samples_per_s": round(line.samples_per_s, 2), **line.values},
                          at=line.wall_time)
        if bar is not None:
            bar.figures(line.samples_per_s, mean_loss)
        if (self.console is not None and not self.console.is_terminal
                and (line.step % self.console_every == 0 or line.step == self.stop_step)):
            log.info("step %d/%d loss %.4f %.1f samples/s", line.step, self.total_steps, mean_loss,
                     line.samples_per_s)

    def save_after_step(self, step: int) -> None:
        """Save when the checkpointer's cadence says so (a step that ends a validated epoch may wait for it)."""
        validated_next = self.micro >= self.usable_micro and self._eval_due(self.epoch + 1)
        cadence = self.cadence
        if cadence is not None:
            cadence.step_end(step)
        if self.checkpointer.due_after_step(step, step >= self.stop_step, validated_next,
                                            cadence is not None and cadence.due(step)):
            self.save()

    def save_at_epoch_end(self, epoch: int) -> None:
        """Save at an epoch's end (or where training stopped) when the checkpointer's cadence says so."""
        if self.checkpointer.due_at_epoch_end(self.last_eval_step == self.step, self.step >= self.stop_step):
            self.save()

    # -- memory figures and the evaluation schedule --------------------------------
    def _memory_record(self) -> dict[str, Any]:
        """This rank's memory figures since the last record (to its telemetry file); rank 0's are returned."""
        mem = memory_figures(self.world.device)
        if not mem:
            return {}
        self.telemetry.record({"step": self.step, "kind": "memory", "time": round(time.time(), 3), **mem})
        torch.cuda.reset_peak_memory_stats(self.world.device)
        return mem

    def _eval_due(self, epochs_done: int) -> bool:
        """Whether validation runs once `epochs_done` epochs are complete."""
        t = self.spec.train
        return epochs_done % t.eval_every == 0 or epochs_done == t.epochs or self.step >= self.stop_step

    @property
    def stopped_early(self) -> bool:
        """Whether train.early_stop ended training (before its last step)."""
        return self.early is not None and self.early.stopped_step is not None

    def watch_patience(self) -> None:
        """train.early_stop counts an epoch's scheduled validation; where patience runs out, training stops here.

        Only the validations every run makes count: not the one where --max-steps stopped inside an epoch, so a
        stopped and resumed run counts what one that never stopped counts. Every rank takes rank 0's value.
        """
        early, t = self.early, self.spec.train
        if early is None or self.last_eval_step != self.step or not (
                self.epoch % t.eval_every == 0 or self.epoch == t.epochs):
            return
        if early.metric not in self.last_eval:
            raise ConfigError(f"train.early_stop.metric {early.metric!r} is not a validation metric of this task (it "
                              f"reports {', '.join(sorted(self.last_eval))}); fix it")
        value = self.world.broadcast_from_main([self.last_eval[early.metric]])[0]
        if not early.observe(value, self.step) or self.step >= self.total_steps:
            return
        early.stopped_step = self.step
        if self.step < self.stop_step and self.step % t.log_every and self.step > self.fit_start_step + 1:
            self.stop_step = self.step
            self.log_step(self.step)  # the interval since the last log line, which the stop cut short
        self.stop_step = self.step
        log.info("early stop at step %d of %d (epoch %d): %s", self.step, self.total_steps, self.epoch,
                 early.reason())

    def run_eval(self) -> None:
        """Validate, log on rank 0, and remember the result for the checkpoint."""
        self.flush_line()  # the train line of this step goes before its validation's
        self.phase = "eval"
        values = self.evaluate()
        if not values:
            return
        self.checkpointer.check_metric(values)
        self.last_eval = values
        self.last_eval_step = self.step
        if self.metrics is not None:
            self.metrics.write(self.step, values, kind="val")
        log.info("validation at step %d: %s", self.step,
                 ", ".join(f"{k} {v:.4g}" for k, v in values.items()))
        settle_heap()  # the validation's garbage (its metric, its batches) out of training's way

    def close(self) -> None:
        """Drop the wrapper before the process group goes (gloo can hang at exit otherwise)."""
        self.telemetry.close()
        self.feed.close()
        self.checkpointer.close()
        # the states hold the wrapped model (and hold this Trainer): none of it may outlive the process group
        del self.optimizer, self.scheduler, self.states, self.checkpointer
        self.model = unwrap(self.model)
