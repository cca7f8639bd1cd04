"""Per-process entry point, started by torchrun: `python -m musubi.worker.worker JOB_DIR`.

Reads the resolved job (`JOB_DIR/job.json`, written by the launcher), binds the
device and starts the process group (world.py), trains (trainer.py), and tears
down in the safe order. A `ConfigError` on any rank is written to
`JOB_DIR/logs/error-rank{r}.txt` and ends the rank with exit code 2, so the
launcher can print one line instead of a wall of tracebacks.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from musubi.config.load import job_from_dict
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.store.startup import mark, wait_for_file

log = logging.getLogger("musubi.worker")

EXIT_CONFIG = 2


def _write_error(job_dir: Path, rank: int, kind: str, message: str, exc: BaseException | None = None) -> None:
    logs = job_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"error-rank{rank}.txt").write_text(json.dumps({"kind": kind, "message": message}), encoding="utf-8")
    # Kept per attempt (error-rank* is cleared by the next attempt): goodput names each failure's cause.
    from musubi.contract.world import attempt_id
    from musubi.recovery.repeats import exception_site

    exits = logs / "exits"
    exits.mkdir(exist_ok=True)
    # Where it was raised: a failure that repeats at the same line is a defect (recovery/repeats.py).
    where = exception_site(exc) if exc is not None else {}
    (exits / f"a{attempt_id()}-rank{rank}.json").write_text(
        json.dumps({"rank": rank, "kind": kind, "message": message[:500], "time": time.time(), **where}),
        encoding="utf-8")


def _restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _start_watchdog(spec, world, job_dir: Path, launch: int, t_start: float):  # noqa: ANN001, ANN202
    """This rank's heartbeat and watchdog thread (hang detection), and rank 0's goodput progress log."""
    from musubi.contract.world import attempt_id
    from musubi.recovery.goodput import ProgressLog
    from musubi.recovery.watchdog import Heartbeat, Watchdog

    os.environ["MUSUBI_LAUNCH"] = str(launch)
    progress = ProgressLog(job_dir, attempt_id(), t_start) if world.is_main else None
    heartbeat = Heartbeat(progress=progress)
    spec_w = spec.watchdog
    if not spec_w.enabled:  # still publish heartbeats and progress (goodput), never judge
        spec_w = spec_w.model_copy(update={"floor_s": 86_400.0})
    watchdog = Watchdog(job_dir, world.rank, world.size, spec_w, float(spec.train.timeout_s), heartbeat)
    watchdog.start()
    return watchdog, heartbeat, progress


def _log_gap(job_dir: Path, restarts: int, resumed_step: int, t_start: float) -> None:
    """One line on the failed previous attempt: its cause, the step it reached, the steps to redo, the downtime."""
    from musubi.contract.world import attempt_id
    from musubi.recovery.goodput import attempt_failure, failure_summary

    now = attempt_id()
    prev = f"{now.split('.')[0]}.{restarts - 1}"
    try:
        failed = attempt_failure(job_dir, prev)
    except (OSError, ValueError, KeyError) as e:  # bookkeeping never stops the restart
        log.warning("attempt %s after %s failed (its record is unreadable: %s)", now, prev, e)
        return
    reached = failed["reached_step"]
    log.warning("attempt %s after %s failed (%s): it reached step %d, resumed from step %d: %d step(s) to redo, "
                "%.1f s down", now, prev, failure_summary(failed), reached, resumed_step,
                max(0, reached - resumed_step), max(0.0, time.time() - failed["end"]))


def wait_for_gate() -> bool:
    """Wait until the fleet hands this job its GPUs; False at once when no gate was set.

    The fleet starts a job while the previous job on its GPUs still evaluates (MUSUBI_GATE names the
    file it writes when that evaluation ends): imports, torchrun, rendezvous and the process group
    overlap that tail, and the model is built only on free GPUs. MUSUBI_GATE_PID is the fleet's pid: a
    fleet that died never opens the gate, so the wait ends with an error instead of forever."""
    gate = os.environ.get("MUSUBI_GATE")
    if not gate:
        return False
    owner = int(os.environ.get("MUSUBI_GATE_PID", "0") or 0)
    path = Path(gate)
    import psutil

    if not wait_for_file(path, lambda: not owner or psutil.pid_exists(owner)):
        raise RuntimeError(f"the fleet (pid {owner}) that was to open {path} is gone")
    return True


def _stop_on_repeat(job_dir: Path, world, launch: int, restarts: int) -> str | None:  # noqa: ANN001
    """The defect line when the two attempts before this one failed the same way (agreed by every rank), else None.

    Rank 0 reads the records; one all-reduce makes its verdict every rank's (recovery/repeats.py)."""
    line = None
    if world.is_main:
        from musubi.recovery.goodput import repeated_failure
        from musubi.recovery.repeats import defect_line

        try:
            defect = repeated_failure(job_dir, launch, restarts)
        except (OSError, ValueError, KeyError) as e:  # unreadable records: restart as before
            log.warning("could not compare the last two failures (%s): restarting", e)
            defect = None
        line = defect_line(job_dir.name, defect) if defect else None
    if not world.all_reduce_max(int(line is not None)):
        return None
    return line or "the same failure struck again after a restart (rank 0 has the details): a defect"


def main(argv: list[str] | None = None) -> int:
    """Run one rank of a job; returns the process exit code.

    The cyclic garbage collector is off from here until training starts, where fit() collects set-up's
    garbage, freezes what lives on and turns the collector back on (trainer.settle_heap). Set-up mostly creates
    objects that live on (torch's, DCP's and sympy's modules, torch._dynamo's, which DDP and every optimizer
    import, the model): collections along the way would walk them again and again and free little. The
    imports' objects are frozen as soon as they are in, so fit()'s first collection walks only set-up's own.
    A rank of the tiny test job spends less CPU time with the collector off, and less again with the imports
    frozen (BENCHMARKS.md, start-up). The batch probe still collects after each out-of-memory (autobatch.py).
    """
    gc.disable()
    try:
        return _main(argv)
    finally:
        gc.enable()


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="musubi-worker")
    ap.add_argument("job_dir", type=Path)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--stop-at-step", type=int, default=None)
    ap.add_argument("--probe-only", action="store_true")
    args = ap.parse_args(argv)
    job_dir: Path = args.job_dir
    rank = int(os.environ.get("RANK", "0"))
    restarts = _restart_count()
    err_file = job_dir / "logs" / f"error-rank{rank}.txt"
    if restarts and err_file.is_file():
        # torchrun restarts after any failure; a configuration error or a defect will not go away.
        from musubi.recovery.repeats import EXIT_DEFECT

        try:
            kind = json.loads(err_file.read_text(encoding="utf-8")).get("kind")
        except ValueError:
            kind = None
        if kind in ("config", "defect"):
            return EXIT_CONFIG if kind == "config" else EXIT_DEFECT
    err_file.unlink(missing_ok=True)
    from musubi.worker.pinning import pin_rank

    # First thing: every thread torch starts later, and every loader worker, inherits these cores.
    pinned = pin_rank(int(os.environ.get("LOCAL_RANK", "0")))
    trainer = None
    world = None
    watchdog = None
    t_start = time.time()
    main_rank = rank == 0  # the one rank that writes the start-up marks (store/startup.py)
    if main_rank:
        import psutil

        mark(job_dir, "worker", psutil.Process().create_time())
    try:
        import torch  # noqa: F401  (imported after argument parsing: fast --help)

        from musubi.contract.inject import Injector
        from musubi.contract.world import init_world, shutdown_world
        from musubi.recovery.memory import EXIT_OOM, is_oom, record_oom
        from musubi.tasks.registry import build_task
        from musubi.worker.batching import decide_batch
        from musubi.worker.precision import resolve_precision
        from musubi.worker.reporting import MetricsWriter, setup_logging
        from musubi.worker.trainer import RunOptions, Trainer, build_optimizer

        gc.freeze()  # the modules just imported live as long as the process: no collection need walk them again
        record = json.loads((job_dir / RUN_FILES.job).read_text(encoding="utf-8"))
        spec = job_from_dict(record["config"], source=str(job_dir / RUN_FILES.job))
        injector = Injector.from_env(rank, job_dir / "logs" / "inject")
        if main_rank:
            mark(job_dir, "imported")
        world = init_world(spec.train.timeout_s)
        if main_rank:
            mark(job_dir, "world")
        if wait_for_gate():
            if main_rank:
                mark(job_dir, "gate")
        console = setup_logging(world, job_dir / "logs")
        if restarts >= 2:
            defect = _stop_on_repeat(job_dir, world, int(record.get("attempts", 1)), restarts)
            if defect is not None:
                from musubi.recovery.repeats import EXIT_DEFECT

                if world.is_main:
                    log.error("%s", defect)
                _write_error(job_dir, rank, "defect", defect)
                shutdown_world()
                return EXIT_DEFECT
        watchdog, heartbeat, progress = _start_watchdog(spec, world, job_dir, int(record.get("attempts", 1)), t_start)
        from musubi.worker.devices import check_unique_devices

        check_unique_devices(world)  # abort at start if two ranks share one GPU
        from musubi.worker.pinning import OVERSUBSCRIBED, configure_threads

        workers_from = "auto (this rank's cores)" if spec.data.workers == "auto" else "config"
        threads = configure_threads(spec, pinned)
        log.log(logging.WARNING if OVERSUBSCRIBED in threads else logging.INFO, "rank %d: %s", world.rank, threads)
        if restarts:
            log.warning("restart %d of this job (torchrun)", restarts)
            from musubi.checkpoint.daemons import reap_checkpoint_daemons
            from musubi.contract.world import attempt_id

            reap_checkpoint_daemons(job_dir, skip_attempt=attempt_id())  # a killed rank's daemon outlives it
        log.info("building the model, optimizer and data loaders (%s, %s)...", spec.task, spec.model)
        task = build_task(spec)
        task.use_device(world.device)  # before the data sets: `data.gpu_decode: auto` decides on it
        task.validate()
        precision = resolve_precision(spec.train.precision, world.device)
        if restarts:
            from musubi.recovery.numerics import clear_pending, current_precision

            bf16_ok = world.device.type != "cuda" or torch.cuda.is_bf16_supported()
            precision = current_precision(job_dir, precision, bf16_ok, world.is_main)
            spec.train.precision = precision  # the Trainer reads it from the spec
            world.barrier()  # every rank read the fault, rank 0 moved bad checkpoints aside
            if world.is_main:
                clear_pending(job_dir)
        plan, _recoveries = decide_batch(spec, task, world, job_dir, precision, injector,
                                         lambda m: build_optimizer(m, spec, 1e-3))
        if main_rank:
            mark(job_dir, "batch")
        from musubi.worker.plan_record import write_plan_record

        write_plan_record(job_dir, spec, task, world, plan, precision)
        if args.probe_only:
            if world.is_main:
                print(json.dumps({"per_rank_batch": plan.per_rank, "global_batch": plan.global_batch,
                                  "lr": plan.lr, "source": plan.source}), flush=True)
            watchdog.stop()
            shutdown_world()
            return 0
        # A torchrun restart resumes when an intact checkpoint exists (Trainer.resume checks checksums)
        # and otherwise starts from step 0; only the user's --resume insists on one.
        opts = RunOptions(resume=args.resume or restarts > 0, stop_at_step=args.stop_at_step)
        metrics = None
        try:
            trainer = Trainer(spec, task, world, job_dir, opts, console, plan=plan, injector=injector,
                              heartbeat=heartbeat)
            if main_rank:
                mark(job_dir, "model")
            if opts.resume:
                trainer.resume(automatic=not args.resume)
            if main_rank:
                mark(job_dir, "fit")
            if restarts and world.is_main:
                _log_gap(job_dir, restarts, trainer.step, t_start)
            restarted = opts.resume or restarts > 0
            metrics = MetricsWriter(job_dir, trainer.step if restarted else None, spec.tracking, spec.name,
                                    record["config"]) if world.is_main else None
            summary = trainer.fit(metrics)
            if main_rank:
                mark(job_dir, "trained")
        except FloatingPointError as e:
            # Every rank saw the same non-finite all-reduced loss at the same step (see numerics.py).
            from musubi.recovery.numerics import EXIT_NUMERICS, record_nonfinite, safer_precision
            from musubi.worker.log_window import NonFiniteLoss

            # a log line's loss is read up to an interval after its step: the step is the line's, not the loop's
            step = e.step if isinstance(e, NonFiniteLoss) else trainer.step if trainer is not None else 0
            last_good = trainer.last_finite_step if trainer is not None else 0
            if safer_precision(precision, True) is None:
                raise FloatingPointError(f"{e} in fp32 (nothing safer to fall back to): lower train.lr, add "
                                         "train.grad_clip or check the data") from None
            record_nonfinite(job_dir, world.rank, step, last_good, precision, str(e))
            _write_error(job_dir, rank, "numerics", f"{e} in {precision}: rolling back to step <= {last_good} "
                         f"in a safer precision")
            log.error("%s in %s: restarting from the last good checkpoint in a safer precision", e, precision)
            logging.shutdown()
            return EXIT_NUMERICS
        except Exception as e:
            if not is_oom(e):
                raise
            # Peers may be inside a collective this rank will never join: record, leave at once,
            # and let torchrun restart every rank with the smaller batch (see memory.py).
            step = trainer.step + 1 if trainer is not None else 1
            phase = trainer.phase if trainer is not None else "setup"
            done = trainer.step - trainer.fit_start_step if trainer is not None else 0
            record_oom(job_dir, world.rank, step, phase, plan.per_rank, plan.accumulation, world.device, str(e),
                       steps_done=done)
            _write_error(job_dir, rank, "oom", f"out of memory in {phase} at step {step} "
                         f"(per-rank batch {plan.per_rank}): {e}")
            log.error("out of memory in %s at step %d (per-rank batch %d): restarting all ranks", phase, step,
                      plan.per_rank)
            logging.shutdown()
            return EXIT_OOM
        finally:
            if metrics is not None:
                metrics.close()
        if world.is_main:
            summary["batch_source"] = plan.source
            summary["per_rank_batch"] = plan.per_rank
            summary["accumulation"] = plan.accumulation
            summary["restarts"] = restarts
            loader = getattr(getattr(trainer, "feed", None), "plan", None)
            if loader is not None:  # on-device synthetic data has no loader
                measured = getattr(trainer.feed, "measured", None)
                if measured:
                    workers_from = "measured (samples/s: " + ", ".join(
                        f"{k} workers {r:.0f}" for k, r in measured.items()) + ")"
                summary["loader"] = {**loader.record(), "workers_from": workers_from, **task.feed_counts(),
                                     "times": trainer.feed.times()}
            (job_dir / RUN_FILES.summary).write_text(json.dumps(summary, indent=1), encoding="utf-8")
            if summary["val"]:
                (job_dir / RUN_FILES.eval).write_text(
                    json.dumps({"metrics": summary["val"], "step": summary["steps"],
                                "primary_metric": task.primary_metric, "classes": task.class_names(),
                                "how": "validation split, each sample counted once over all ranks"
                                + _merge_how(task), **task.eval_notes(trainer.model)}, indent=1),
                    encoding="utf-8")
            log.info("done: %d/%d steps, %.1fs", summary["steps"], summary["total_steps"], summary["train_s"])
        if progress is not None:
            progress.end(trainer.step)
        watchdog.stop()
        trainer.close()
        trainer = None
        # DDP sits in reference cycles (reducer hooks): collect it now, while the
        # process group still exists, or gloo may hang or abort at exit.
        gc.collect()
        shutdown_world()
        return 0
    except ConfigError as e:
        _write_error(job_dir, rank, "config", str(e))
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except Exception as e:
        _write_error(job_dir, rank, type(e).__name__, f"{type(e).__name__}: {e}", e)
        traceback.print_exc()
        return 1


def _merge_how(task: Any) -> str:
    """How sliced evaluation merged tile detections (eval.json's "how"), or ""."""
    data = getattr(getattr(task, "spec", None), "data", None)
    sl = getattr(data, "slice", None)
    if sl is None or not getattr(sl, "sliced_eval", False) or getattr(data, "synthetic", None) is not None:
        return ""
    return (f"; whole frames predicted on {sl.tile} px tiles (overlap {sl.overlap:g}), merged by {sl.merge}"
            f"{f' ({sl.match_metric})' if sl.merge == 'nmm' else ''} at {sl.nms_iou:g}")


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is flushed and the process group is gone: skip interpreter teardown,
    # whose C++ destructors (gloo threads) were seen to abort a rank at exit, and on
    # failure a peer may be stuck in a collective; torchrun ends the others.
    os._exit(code)

