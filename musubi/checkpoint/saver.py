"""The Checkpointer: the states handed to it once (states.py), saved by step and loaded back (resume.py).

Writing is synchronous, or asynchronous with DCP `async_save` (the step waits only for staging).

Asynchronous save, one step at a time:

1. wait for the previous save of this rank (at most one in flight; a wait here is blocked time);
2. rank 0 clears a leftover directory of this step; every rank waits for it (a barrier);
3. `dcp.async_save` copies the state to host memory (the only part the step waits for) and hands
   the write to a background thread (its own gloo group, `world.side_group()`) or a background
   process (DCP's checkpoint daemon with its own process group);
4. rank 0 commits in a thread of its own once its future resolves.

Why rank 0's resolved future is enough to commit, with no extra collective: DCP's save ends with a
gather of every rank's write results to the coordinator (rank 0), which writes `.metadata` only
then; FileSystemWriter fsyncs every shard before reporting it. A rank whose write failed makes the
coordinator's future fail. So rank 0's future resolves successfully only once every rank's shards
are durable, and the marker written after it never names a partial checkpoint.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from musubi.checkpoint import checkpoint as ckpt
from musubi.checkpoint.daemons import record_daemon
from musubi.checkpoint.resume import find_agreed, load_into
from musubi.checkpoint.staging import HostStager, holds_dtensor
from musubi.checkpoint.states import CheckpointStates
from musubi.checkpoint.writer import WRITER_NICE, BackgroundWriter
from musubi.config.job import CheckpointSpec
from musubi.contract.errors import ConfigError, one_line
from musubi.contract.inject import ENV as INJECT_ENV
from musubi.contract.inject import Injector
from musubi.contract.world import World, side_group

log = logging.getLogger("musubi.checkpoint")

#: What a failed save raises. DCP gathers every rank's write error into a CheckpointException, a BaseException
#: (not an Exception): caught by name, or a failed save (a full disk) ends the rank with no record of why.
SAVE_ERRORS = (Exception, CheckpointException)


def resolve_mode(asked: str, cuda: bool = True) -> str:
    """off | thread | process, from the job's `checkpoint.async_mode`.

    auto: process on GPU ranks (the write and its serialisation leave the training process: no GIL
    contention with the step); thread on CPU ranks, which have no device-to-host copy to hide and
    whose cores are the training's own: a second interpreter per rank costs more than it saves there.
    """
    if asked == "auto":
        return "process" if cuda else "thread"
    return asked


def _write_and_tear(writer: FileSystemWriter, plan: Any, planner: Any) -> Future:
    """Write the shards as DCP does, then cut the first one in half: what a write stopped mid-file leaves."""
    fut = FileSystemWriter.write_data(writer, plan, planner)
    results = fut.wait() if hasattr(fut, "wait") else fut.result()
    for r in results:
        shard = Path(writer.path) / r.storage_data.relative_path
        if shard.is_file():
            os.truncate(shard, shard.stat().st_size // 2)
            break
    return fut


class _KillingWriter(FileSystemWriter):
    """Fault injection (`ckpt_kill:phase=write`): the rank dies while its shards are being written.

    The shards are written, then the first one is cut in half and the rank is SIGKILLed:
    what a rank killed in the middle of a file leaves behind. In process mode this runs in
    DCP's checkpoint process, so the training rank (`kill_pid`) is killed first.
    """

    def __init__(self, path: str, kill_pid: int) -> None:
        super().__init__(path)
        self.kill_pid = kill_pid

    def write_data(self, plan: Any, planner: Any) -> Future:
        fut = _write_and_tear(self, plan, planner)
        os.kill(self.kill_pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
        return fut  # not reached


class _FullDiskWriter(FileSystemWriter):
    """Fault injection (`disk_full`): this rank's write of a checkpoint fails as on a full disk.

    The shards are written, the first is cut in half (the space ran out inside it) and the write raises
    OSError ENOSPC, which DCP hands to every rank (a synchronous save raises; an asynchronous one fails its
    future: rank 0 does not commit and the previous committed checkpoint stays the one to resume from).
    """

    def write_data(self, plan: Any, planner: Any) -> Future:
        _write_and_tear(self, plan, planner)
        raise OSError(errno.ENOSPC, f"No space left on device (injected by {INJECT_ENV} disk_full)", self.path)


@dataclass
class _InFlight:
    step: int
    path: Path
    future: Future
    t0: float  # perf_counter at the start of save()
    blocked_s: float
    committer: threading.Thread | None = None
    done: dict[str, Any] = field(default_factory=dict)
    stager: Any = None  # this save's own stager, closed once the save resolved (see _make_stager)

    def release(self) -> None:
        """Free this save's staging buffers; only once its future has resolved."""
        stager, self.stager = self.stager, None
        _close_stager(stager)


def _close_stager(stager: Any) -> None:
    """Close a DCP stager; closing twice is harmless (torch 2.11 already closed it after staging)."""
    if stager is None:
        return
    try:
        stager.close()
    except Exception as e:  # noqa: BLE001 - releasing host buffers must never fail a save
        log.info("checkpoint staging buffers not released cleanly: %s", one_line(e, 120))


class Checkpointer:
    """One rank's checkpoints of the states handed to it once (checkpoint/states.py): `save(step)`,
    `load(step)` or `load()` (the newest intact one). When to save is the trainer's to ask (`due_*`);
    at most one save in flight; rank 0 commits and applies retention. With `checkpoint.enabled` off it
    saves nothing and still loads (a torchrun restart looks for a checkpoint to resume from)."""

    def __init__(self, root: Path, spec: CheckpointSpec, world: World, injector: Injector, states: CheckpointStates,
                 default_metric: str | None = None, telemetry: Path | None = None, validated: bool = False) -> None:
        self.root, self.spec, self.world, self.injector, self.states = root, spec, world, injector, states
        self.enabled = spec.enabled
        self.mode = resolve_mode(spec.async_mode, world.is_cuda)
        self.best_metric = spec.best_metric or default_metric
        #: keep_best ranks checkpoints by validation: only a job with a validation set has one to rank by.
        self.keeps_best = self.enabled and spec.keep_best > 0 and validated
        self.telemetry = telemetry
        # Thread mode: the save's collectives run beside DDP's, so they need a group of their own.
        self.group = side_group() if self.enabled and self.mode == "thread" else None
        #: Keep host copies across saves (HostStager); False: DCP's stager, a fresh one per save.
        self.reuse_buffers = True
        #: nice of the async save's writing thread (checkpoint/writer.py); 0 writes at the rank's priority.
        self.writer_nice = WRITER_NICE
        #: DCP's copy-ahead of the async save's writer in bytes (checkpoint/writer.py); None: DCP's default.
        self.writer_copy_ahead: int | None = None
        self._host: HostStager | None = None
        self.inflight: _InFlight | None = None
        self._records: list[dict[str, Any]] = []
        self._daemon_recorded = False
        self._lock = threading.Lock()

    @property
    def host_buffer_bytes(self) -> int:
        """Bytes of host buffers allocated for staging so far (constant after the first save)."""
        return self._host.allocated_bytes if self._host is not None else 0

    def _host_stager(self) -> HostStager:
        """The Checkpointer's kept host buffers (see musubi/checkpoint/staging.py)."""
        if self._host is None:
            self._host = HostStager(pin=self.world.is_cuda, share=self.mode == "process")
        return self._host

    def _make_stager(self) -> Any:
        """A stager for one save: host copies pinned on GPU, in shared memory for the checkpoint process.

        One per save, never reused. torch 2.11's `DefaultStager._stage` ends every staging with
        `StateDictStager.close()`, which empties the deepcopy dispatch table, so a second save
        through the same stager fails with `KeyError: <class 'type'>` (seen on the GPU machine);
        torch 2.14 leaves a caller-owned stager open. A fresh stager behaves the same
        on both. It is closed once its save is durable (`_InFlight.release`): until then the
        checkpoint process or the writer thread may still read the staged copies.
        """
        cuda = self.world.is_cuda
        return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=self.mode == "process",
                                            use_async_staging=False, use_non_blocking_copy=cuda))

    # -- cadence -----------------------------------------------------------------
    def due_after_step(self, step: int, last: bool, validated_next: bool, auto_due: bool = False) -> bool:
        """Whether optimizer step `step` is saved at its end: every `checkpoint.every_steps` steps, or under
        `every_steps: auto` where the ranks' agreed cadence says (`auto_due`, worker/save_cadence.py).

        Not the last step (it is saved where training ends, after its validation), and under keep_best
        not a step whose weights are validated next (saved after that, carrying its metric).
        """
        every = self.spec.every_steps
        due = auto_due if every == "auto" else bool(every) and step % every == 0
        return self.enabled and due and not last and not (validated_next and self.keeps_best)

    def due_at_epoch_end(self, validated: bool, last: bool) -> bool:
        """Whether the end of an epoch (or of training inside one) is saved.

        Always without `every_steps` and at the last step; under keep_best whenever the weights were
        just validated, so each ranked checkpoint carries its own metric.
        """
        return self.enabled and (not self.spec.every_steps or last or (validated and self.keeps_best))

    def check_metric(self, values: dict[str, float]) -> None:
        """ConfigError when keep_best ranks by a metric the validation does not report."""
        if self.keeps_best and self.best_metric is not None and self.best_metric not in values:
            reported = ", ".join(sorted(k for k in values if k != "eval_s"))
            raise ConfigError(f"checkpoint.best_metric {self.best_metric!r} is not a validation metric of this task "
                              f"(it reports {reported}); fix it or set keep_best: 0")

    # -- loading -----------------------------------------------------------------
    def load(self, step: int | None = None, automatic: bool = False) -> ckpt.Committed | None:
        """Collective: load checkpoint `step` (None: the newest intact one) into the states; return it.

        Every rank agrees on the checkpoint first (checkpoint/resume.py). None (nothing loaded) only when
        `automatic` (a torchrun restart, not the user's --resume) finds no intact checkpoint: training starts
        from step 0; otherwise that is a ConfigError.
        """
        found = find_agreed(self.root, self.world, automatic, step)
        if found is not None:
            load_into(found, self.states, self.world)
        return found

    # -- saving ------------------------------------------------------------------
    def save(self, step: int, metric: dict[str, float] | None = None, last: bool = False) -> None:
        """Collective: start (async) or do (sync) the checkpoint of `step` of the states; `metric`: the validation
        of these weights, which keep_best ranks by; `last`: the run's last save (no step left to yield to)."""
        t0 = time.perf_counter()
        trainer_state, rank_state = self.states.global_state(), self.states.rank.state_dict()
        self.wait()
        d = ckpt.prepare_dir(self.root, step, self.world)
        state = ckpt.save_state(self.states.model, self.states.optimizer, rank_state, self.world)
        self.injector.checkpoint_block(step)  # `ckpt_stall` (phase block): what the step waits for
        # Frozen now: the training thread moves on while the commit waits for the shards.
        trainer_state = json.loads(json.dumps(trainer_state))
        metric = dict(metric or {})
        writer = _KillingWriter(str(d), os.getpid()) if self.injector.kill_while_writing(step) else None
        if writer is None and self.injector.disk_full_at(step):
            writer = _FullDiskWriter(str(d))
        if writer is None and self.mode != "off":  # the async writer yields the rank's cores to the step
            # ... but after the last step the rank only waits for it: at nice 10 it would yield to other jobs'
            # processes on shared cores instead (a 7.6 MB save took 2.5 s to be durable on a loaded 2-core machine)
            writer = BackgroundWriter(str(d), 0 if last else self.writer_nice, self.writer_copy_ahead)
        if self.mode == "off":
            try:
                dcp.save(state, checkpoint_id=str(d), storage_writer=writer)
            except SAVE_ERRORS as e:
                # Every rank gets the same error (DCP all-reduces the write results): all skip this save alike.
                self._failed(d, step, "sync", time.perf_counter() - t0, e)
                return
            self.injector.checkpoint_write(step)
            # dcp.save returned on every rank after rank 0 gathered every rank's write result.
            if self.world.is_main:
                self._commit(d, step, trainer_state, metric)
            self.world.barrier()
            elapsed = time.perf_counter() - t0
            self._record({"step": step, "mode": "sync", "blocked_s": elapsed, "durable_s": elapsed, "ok": True})
            log.info("checkpoint step %d committed in %.2fs: %s", step, elapsed, d)
            return
        stager = None  # a per-save stager (sharded state), closed once that save resolved
        if self.reuse_buffers and not holds_dtensor(state):
            async_stager = self._host_stager()
        else:
            async_stager = stager = self._make_stager()
        kind = AsyncCheckpointerType.PROCESS if self.mode == "process" else AsyncCheckpointerType.THREAD
        try:
            ret = dcp.async_save(state, checkpoint_id=str(d), storage_writer=writer, process_group=self.group,
                                 async_checkpointer_type=kind, async_stager=async_stager)
        except BaseException:
            _close_stager(stager)
            raise
        # A stager that stages in the background gets an AsyncSaveResponse; ours stage before returning (a Future).
        fut = getattr(ret, "upload_completion", ret)
        if self.mode == "process" and not self._daemon_recorded:
            self._daemon_recorded = True
            threading.Thread(target=self._record_daemon, args=(fut,), name="musubi-ckpt-daemon", daemon=True).start()
        blocked = time.perf_counter() - t0
        self.inflight = _InFlight(step, d, fut, t0, blocked, stager=stager)
        if self.world.is_main:
            th = threading.Thread(target=self._commit_when_durable, args=(self.inflight, trainer_state, metric),
                                  name="musubi-ckpt-commit", daemon=True)
            self.inflight.committer = th
            th.start()
        self._telemetry({"step": step, "kind": "checkpoint", "mode": self.mode, "blocked_s": round(blocked, 4)})

    def _commit(self, d: Path, step: int, trainer_state: dict[str, Any], metric: dict[str, float]) -> None:
        ckpt.commit(d, step, trainer_state, self.world.size, metric)
        s = self.spec
        for gone in ckpt.retain(self.root, s.keep_last, s.keep_best, self.best_metric, s.best_mode):
            log.info("retention: deleted %s", gone.name)

    def _commit_when_durable(self, job: _InFlight, trainer_state: dict[str, Any], metric: dict[str, float]) -> None:
        """Rank 0's commit thread: wait for the shards of every rank, then write the marker."""
        try:
            job.future.result()
        except SAVE_ERRORS as e:  # a failed save must not kill training: the previous one stays
            job.done = {"ok": False, "error": one_line(e, 200)}
            self._failed(job.path, job.step, self.mode, job.blocked_s, e)
            return
        self.injector.checkpoint_write(job.step)
        self._commit(job.path, job.step, trainer_state, metric)
        durable = time.perf_counter() - job.t0
        job.done = {"ok": True}
        self._record({"step": job.step, "mode": self.mode, "blocked_s": job.blocked_s, "durable_s": durable,
                      "ok": True})
        log.info("checkpoint step %d committed: blocked the step %.3fs, durable after %.2fs: %s", job.step,
                 job.blocked_s, durable, job.path)

    def _failed(self, d: Path, step: int, mode: str, blocked_s: float, e: BaseException) -> None:
        """A save that failed on some rank: not committed; rank 0 deletes what it wrote (on a full disk the next
        save needs that space; every rank's write had ended when the error reached rank 0)."""
        if self.world.is_main:
            log.warning("checkpoint %s failed (%s): not committed and deleted; the previous committed one stays", d,
                        one_line(e, 200))
            shutil.rmtree(d, ignore_errors=True)
        self._record({"step": step, "mode": mode, "blocked_s": blocked_s, "ok": False})

    def wait(self) -> float:
        """Wait for the save in flight (and rank 0's commit); return the seconds waited."""
        job = self.inflight
        if job is None:
            return 0.0
        t0 = time.perf_counter()
        try:
            job.future.result()
        except SAVE_ERRORS as e:  # reported by rank 0's commit thread; others note it
            if not self.world.is_main:
                log.warning("checkpoint %s failed on this rank: %s", job.path, one_line(e, 200))
        if job.committer is not None:
            job.committer.join()
        job.release()
        self.inflight = None
        return time.perf_counter() - t0

    def _record_daemon(self, fut: Future, poll_s: float = 0.05) -> None:
        """Note DCP's checkpoint process (pid, start time) as soon as it is spawned: if this rank is
        SIGKILLed the daemon survives it, and the next attempt or the launcher ends it
        (`reap_checkpoint_daemons`). It is found as this rank's child running multiprocessing's spawn."""
        try:
            import psutil

            from musubi.contract.world import attempt_id

            me = psutil.Process()
            while True:
                found = [c for c in me.children() if "spawn_main" in " ".join(c.cmdline())]
                if found or fut.done():
                    break
                time.sleep(poll_s)
            for c in found:
                record_daemon(self.root.parent, attempt_id(), self.world.rank, c.pid, c.create_time())
        except Exception as e:  # noqa: BLE001 - bookkeeping only
            log.info("checkpoint process not recorded: %s", one_line(e, 120))

    # -- figures -----------------------------------------------------------------
    def _record(self, rec: dict[str, Any]) -> None:
        rec = {k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()}
        with self._lock:
            self._records.append(rec)

    def _telemetry(self, rec: dict[str, Any]) -> None:
        if self.telemetry is not None:
            with open(self.telemetry, "a", encoding="utf-8") as f:
                f.write(json.dumps({"time": round(time.time(), 3), **rec}) + "\n")

    def drain(self) -> list[dict[str, Any]]:
        """Finished saves since the last call (time blocked, time to durable), for metrics.jsonl."""
        with self._lock:
            out, self._records = self._records, []
        return out

    def close(self) -> None:
        """Wait for the last save, release the staging buffers, and end DCP's checkpoint process."""
        self.wait()
        if self._host is not None:
            self._host.close()
            self._host = None
        if self.enabled and self.mode == "process":
            stop_checkpoint_process()


def stop_checkpoint_process(grace_s: float = 3.0) -> None:
    """End DCP's checkpoint daemon of this rank, if one runs.

    Workers leave with os._exit (see worker.py), so the daemon's own clean-up never runs and
    it outlives the rank, holding the launcher's stdout/stderr pipes open (seen here: a
    `musubi train` whose output is captured never ends). torch has no public call for this;
    the daemon's handle is module state of torch's process executor.
    """
    try:
        from torch.distributed.checkpoint import _async_process_executor as executor
    except ImportError:
        return
    daemon = getattr(executor, "_CHECKPOINT_PROCESS", None)
    if daemon is None:
        return
    executor._CHECKPOINT_PROCESS = None
    proc = getattr(daemon, "_save_process", None)
    if proc is None:
        return
    try:
        if proc.is_alive():
            daemon._send(executor._CheckpointSaveProcessControlOpts.TERMINATE)
            # It closes its end of the pipe once it left its loop and destroyed its process group (EOF here);
            # what remains is its interpreter's teardown, seconds of garbage collection over torch's modules
            # with nothing left to write: ended at once, as the ranks end with os._exit.
            pipe, until = daemon._process_pipe, time.monotonic() + grace_s
            while pipe.poll(timeout=max(0.0, until - time.monotonic())):
                pipe.recv()  # nothing is pending after wait(); read on to the EOF
    except (OSError, AttributeError, ValueError, EOFError):
        pass
    if proc.is_alive():  # in its interpreter's teardown, or stuck in its process group's: its peers are gone
        proc.kill()
        proc.join(timeout=grace_s)
