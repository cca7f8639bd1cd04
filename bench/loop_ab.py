"""Musubi's training loop against plain DDP's, inside one process: blocks of steps, each way in turn, interleaved.

Why: at 4x H200 (2026-11-27) `musubi train` ran fcos at 0.975x and resnet50 at 0.969x plain_ddp.py `wall` with
telemetry on, fcos 0.980x with it off, while telemetry's own cost measured under 1 % (bench/telemetry_ab.py).
Separate runs differ by more than the gap (their own cuDNN choices, clocks), so they cannot say which part of
the loop costs it. Here one process builds the job as a rank of `musubi train` builds it (the job file, its
task, musubi's DDP wrapping, optimizer, feed and Trainer; telemetry and checkpoints off) and trains it in
blocks of --block steps, each mode once a cycle in a rotating order; a mode's cost is its block time over the
`plain` block of the same cycle (paired), the median and spread over --cycles cycles.

Modes (all on the same model, optimizer and device batches):
- plain      - plain_ddp.py's loop: zero_grad, the task's loss under autocast, backward, step; ONE batch every
               step (the reference's data: one fixed batch a rank).
- pool       - the same loop over the feed's device pool (DEVICE_POOL batches a rank, cycled as musubi cycles
               them): what different batches every step cost, each step waiting for the slowest rank's.
- loop       - musubi's Trainer.train_step over its feed (events, heartbeat, LR schedule, scaler, the log line
               every train.log_every steps: its all-reduce and copy to the host queued, the line read at the
               next log step; metrics.jsonl on rank 0).
- loop_fixed - `loop` fed the one batch of `plain`: loop less pool is the loop's own cost.
- loop_nolog - `loop` without the log line (no all-reduce or copy every log_every steps).
- loop_sync  - `loop` reading each log line at its own step (`.item()`: the host waits for the GPU), as the loop
               did before 2026-11-27 (worker/log_window.py).
- job        - `loop` with what else runs in a `musubi train` rank with telemetry off: the watchdog thread
               (heartbeat file each interval, peers' files read) and rank 0's progress log (a line a step),
               started before and stopped after the timed steps. (On 2x H200 on 2026-11-27 they were started
               and stopped inside them: part of that run's job - loop of ~0.16 % was the bench's own.)

Python's garbage collector is timed too (gc.callbacks): collections and their milliseconds per mode, every
rank, so a collection inside a block (a pause of the host that the GPU waits on) is seen, not guessed. The
heap is settled after the warm-up as Trainer.fit settles it (trainer.settle_heap: collected, then frozen); with
--no-settle it is not, as before 2026-11-27 (a 139 ms generation-2 collection inside a block on one H200).

    torchrun --nproc-per-node 2 bench/loop_ab.py examples/fcos-bench.yaml --cycles 8 --json $OUT/loop-fcos.json

CPU rehearsal (gloo): `torchrun --nproc-per-node 2 bench/loop_ab.py examples/fcos-bench.yaml --cpu`.
The GPU tier runs it with --forbid-sync (tests/gpu/test_loop_gpu.py): musubi's loop never waits on the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.paired_blocks import add_block_options, chosen_modes, paired_rows, report  # noqa: E402

MODES = ("plain", "pool", "loop", "loop_fixed", "loop_nolog", "loop_sync", "job")
#: Sizes that make the CPU rehearsal take seconds, not hours (2 gloo ranks on 2 cores).
CPU_SETS = {
    "detection": ["data.synthetic.image_size=64", "data.synthetic.max_object=24", "model_args.min_size=64",
                  "model_args.max_size=64", "train.batch=2", "train.precision=fp32"],
    "classification": ["data.synthetic.image_size=32", "train.batch=8", "train.precision=fp32",
                       "model=resnet18"],
}


class GcClock:
    """Garbage collections seen through gc.callbacks: count and milliseconds, summed until read."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.ms = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.ms += (time.perf_counter() - self._t0) * 1e3

    def close(self) -> None:
        """Stop timing collections."""
        gc.callbacks.remove(self._cb)

    def take(self) -> tuple[list[int], float]:
        """(collections per generation, ms) since the last take."""
        out = (self.count, self.ms)
        self.count, self.ms = [0, 0, 0], 0.0
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("job", type=Path, help="a job file with data.synthetic.on_device (examples/*-bench.yaml)")
    ap.add_argument("--set", action="append", default=[], help="an override, as `musubi train --set`")
    add_block_options(ap, MODES, MODES, block=20, cpu_help="rehearsal on CPU (gloo), at the CPU_SETS sizes")
    ap.add_argument("--forbid-sync", action="store_true",
                    help="CUDA: the loop's blocks (not loop_sync's) raise on any host sync "
                         "(torch.cuda.set_sync_debug_mode): a model that syncs by itself, as fcos does, fails it")
    ap.add_argument("--no-settle", action="store_true", help="leave the heap unfrozen (the loop before 2026-11-27)")
    args = ap.parse_args()
    modes = chosen_modes(args.modes, "plain", MODES)

    from musubi.worker.pinning import pin_rank

    pinned = pin_rank(int(os.environ.get("LOCAL_RANK", "0")))  # as the worker: first thing, MUSUBI_CPUS if set
    import torch

    from musubi.config.load import load_job, read_yaml
    from musubi.contract.world import init_world, shutdown_world
    from musubi.recovery.goodput import ProgressLog
    from musubi.recovery.watchdog import Heartbeat, Watchdog
    from musubi.tasks.registry import build_task
    from musubi.worker.feed.loaders import DEVICE_POOL
    from musubi.worker.pinning import configure_threads
    from musubi.worker.precision import autocast
    from musubi.worker.reporting import MetricsWriter, ProgressBar
    from musubi.worker.step_events import STEP_END
    from musubi.worker.trainer import RunOptions, Trainer, settle_heap

    if args.cpu:
        os.environ["MUSUBI_DEVICE"] = "cpu"
    task_kind = read_yaml(args.job).get("task", "")
    sets = (CPU_SETS.get(task_kind, []) if args.cpu else []) + args.set + [
        "telemetry.enabled=false", "checkpoint.enabled=false", "train.max_steps=1000000",
        "data.synthetic.train_size=50000000"]
    spec = load_job(args.job, sets)
    if not (spec.data.synthetic and spec.data.synthetic.on_device):
        raise SystemExit(f"{args.job}: needs data.synthetic.on_device (the reference's data lives on the device)")
    world = init_world(spec.train.timeout_s)
    configure_threads(spec, pinned)
    where = [tempfile.mkdtemp(prefix="musubi-loop-ab-") if world.is_main else None]
    torch.distributed.broadcast_object_list(where, src=0)
    job_dir = Path(where[0]) / "job"
    (job_dir / "logs").mkdir(parents=True, exist_ok=True)
    task = build_task(spec)
    task.use_device(world.device)
    task.validate()
    hb = Heartbeat()
    trainer = Trainer(spec, task, world, job_dir, RunOptions(), None, heartbeat=hb)
    model, opt, dev = trainer.model, trainer.optimizer, world.device
    sync = torch.cuda.synchronize if world.is_cuda else (lambda: None)
    metrics = MetricsWriter(job_dir, None, spec.tracking, spec.name, {}) if world.is_main else None
    trainer.metrics, trainer.bar = metrics, ProgressBar(None, trainer.total_steps, 0, spec.name)
    log_mode = ["queued"]  # "queued" (the loop's own), "sync" (read at its step) or "off"

    def log_line(step: int) -> None:
        if log_mode[0] != "off":
            trainer.log_step(step)
        if log_mode[0] == "sync":
            trainer.flush_line()

    trainer.events.on(STEP_END, log_line)
    pool = list(trainer.feed.pool)
    fixed = [pool[0]] * DEVICE_POOL
    batches = trainer.feed.epoch(0, 0)
    trainer.model.train()
    k = [0]  # the reference loops' position in the pool

    def reference(n: int, cycle_pool: bool) -> None:
        for _ in range(n):
            batch = pool[k[0] % DEVICE_POOL] if cycle_pool else pool[0]
            k[0] += 1
            opt.zero_grad(set_to_none=True)
            with autocast(trainer.precision, dev):
                loss, _ = task.loss(model, batch)
            loss.backward()
            opt.step()

    def musubi(n: int) -> None:
        for _ in range(n):
            if not trainer.train_step(batches):
                raise RuntimeError("the feed ended inside the benchmark: raise data.synthetic.train_size")

    @contextlib.contextmanager
    def prepared(mode: str, warm: bool = False) -> Iterator[None]:
        """Set up a musubi mode's block around its timed steps, and undo it after: the feed's batches, the log
        line's way, the job mode's watchdog thread and progress log (started and stopped outside the timing)."""
        if mode in ("plain", "pool"):
            yield
            return
        trainer.feed.pool = fixed if mode == "loop_fixed" else pool
        trainer.flush_line()  # the last block's queued line: its copy ended with that block (a record written)
        log_mode[0] = {"loop_nolog": "off", "loop_sync": "sync"}.get(mode, "queued")
        watchdog = None
        if mode == "job":
            hb.progress = ProgressLog(job_dir, f"b{k[0]}", time.time()) if world.is_main else None
            watchdog = Watchdog(job_dir, world.rank, world.size, spec.watchdog, float(spec.train.timeout_s), hb)
            watchdog.start()
        # not in the warm-up: its first step waits for the GPU once, on purpose (Trainer.log_step)
        forbid = args.forbid_sync and world.is_cuda and mode != "loop_sync" and not warm
        if forbid:
            torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            if forbid:
                torch.cuda.set_sync_debug_mode("default")
            if watchdog is not None:
                watchdog.stop()
                if hb.progress is not None:
                    hb.progress.end(trainer.step)
                hb.progress = None

    def train(mode: str, n: int) -> None:
        if mode in ("plain", "pool"):
            reference(n, mode == "pool")
        else:
            musubi(n)

    t_start = time.perf_counter()
    for m in ("plain", "loop"):
        with prepared(m, warm=True):
            train(m, args.warmup)
    sync()
    trainer.flush_line()
    if not args.no_settle:
        settle_heap()
    clock = GcClock()
    per_mode: dict[str, list[float]] = {m: [] for m in modes}
    gcs: dict[str, dict[str, Any]] = {m: {"collections": [0, 0, 0], "ms": 0.0, "max_block_ms": 0.0} for m in modes}
    for c in range(args.cycles):
        order = modes[c % len(modes):] + modes[:c % len(modes)]  # each mode takes each place in turn
        for m in order:
            with prepared(m):
                sync()
                clock.take()
                t0 = time.perf_counter()
                train(m, args.block)
                sync()
                dt = time.perf_counter() - t0
                counts, ms = clock.take()
            # the block's time is its slowest rank's; so is its collector's
            v = torch.tensor([dt, ms, *counts], device=dev, dtype=torch.float64)
            torch.distributed.all_reduce(v, op=torch.distributed.ReduceOp.MAX)
            per_mode[m].append(v[0].item() / args.block * 1e3)
            g = gcs[m]
            g["collections"] = [a + int(b) for a, b in zip(g["collections"], v[2:].tolist(), strict=True)]
            g["ms"] = round(g["ms"] + v[1].item(), 2)
            g["max_block_ms"] = round(max(g["max_block_ms"], v[1].item()), 2)
    clock.close()
    if world.is_main:
        rows = paired_rows(per_mode, "plain")
        for m, row in rows.items():
            row["gc"] = gcs[m]
        out = {"job": str(args.job), "sets": sets, "world": world.size, "per_rank_batch": trainer.plan.per_rank,
               "block_steps": args.block, "cycles": args.cycles, "warmup": args.warmup,
               "cores_per_rank": pinned.cores if pinned is not None else len(os.sched_getaffinity(0)),
               "device": torch.cuda.get_device_name(dev) if world.is_cuda else "cpu",
               "torch": torch.__version__, "commit": os.environ.get("MUSUBI_COMMIT", ""),
               "gc_thresholds": gc.get_threshold(), "gc_frozen": gc.get_freeze_count(), "settled": not args.no_settle,
               "wall_s": round(time.perf_counter() - t_start, 1), "modes": rows}
        report(f"{spec.name} x{world.size}", rows, out, args.json)  # cost: over `plain`
    if metrics is not None:
        metrics.close()
    trainer.close()  # the DDP wrapper goes before the process group (gloo)
    shutdown_world()


if __name__ == "__main__":
    main()
