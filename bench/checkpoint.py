"""Asynchronous checkpoints: time blocked, step throughput during a save (every variant, interleaved), recovery.

    python bench/checkpoint.py --nproc 2 --pin --no-recovery --budget-s 200    # GPUs: the saves probe (~4 min)
    python bench/checkpoint.py --cpu --tiny --nproc 2 --no-recovery             # proves it runs, on CPU ranks
    python bench/checkpoint.py --cpu --shape mid --nproc 1 --modes thread --writer-nice 10   # a CPU stall probe

Model: the built-in GPT (`task: lm`) at 12 layers x 1024 wide, vocab 8192 (~160 M parameters; with AdamW's two
moments ~1.9 GB of state, replicated by DDP on every GPU). Targets (issue 46): in the default async mode the step
is blocked <= 5 % of a synchronous save, and steps run at >= 95 % of their speed while a save is in flight.

1. saves (one torchrun launch, `--nproc` ranks, all variants in it): the heap settled as `musubi train` settles
   it (trainer.settle_heap: collected, then frozen; `--no-settle`: not, as this bench was until session 21); a
   few synchronous saves (the baseline of "blocked"); one warm-up save per async mode (the process mode starts
   DCP's checkpoint process there); then ROUNDS. Each round saves once with every variant (async mode x the
   writer thread's nice, `--modes` x `--writer-nice`) in an order shuffled per round (seeded: `--seed`), so a
   drift of the machine (clocks, another tenant) lands on every variant alike. Each save is measured against
   its own local baseline: `--settle-steps` untimed steps, then `--base-steps` steady steps timed just before
   it; then the save (blocked: the longest any rank waited), then steps while it is in flight until every
   rank's save is durable (every rank runs the same number: an all-reduced flag, also run, untimed, beside the
   baseline steps). Throughput during a save = mean baseline step / mean step during the save.
   Per variant: the median over rounds and a distribution-free interval of that median (order statistics,
   >= 95 % coverage where the rounds allow; with 5-6 rounds min..max covers 94-97 %), and a verdict per
   target: "meets" when the whole interval is on the target's good side, "misses" when all of it is on the
   bad side, else "not settled". Per mode, nice N against nice 0 the same way, paired by round. Each save also
   lists its worst step and the garbage collections (gc.callbacks, every thread of rank 0) inside it, so a
   stall is attributed, not guessed.
   `--budget-s` plans the rounds: the launcher gives the ranks a deadline (start + budget - 15 s for the
   teardown), the ranks time their rounds and start another only while the longest one so far still fits
   (at least `--min-rounds`, at most `--rounds`; the decision is all-reduced, so every rank stops together).
   Estimate on 2 GPUs at the GPU shape (session 20: 33 ms steps, durable after 3.7-4.2 s, sync save ~3.5 s):
   ~45 s start-up and set-up, ~20 s for the sync and warm-up saves, ~5 s a save (0.8 s of baseline steps
   + ~4 s in flight) x 4 variants = ~20 s a round: `--budget-s 200` gives ~6 rounds, ~3.5 min in all.
   `--pin` pins each rank to its share of the cores as `musubi train` does, so the writer (which inherits
   them) competes with the step as in training.
2. recovery (not with --no-recovery): `musubi train` of the same model with `MUSUBI_INJECT=kill:rank=1,step=K`;
   from the job's goodput.json, the seconds from the failure to the next attempt's first step. Target <= 60 s.
3. the GIL probe (`--gil-probe`, one process, no torchrun): a GPU-like step (small tensor ops, then a sleep as a
   device sync) beside DCP saves from a thread, interleaved over the writer's nice and the switch interval.

Why the heap is settled (measured on the 2-core CPU machine, 2026-11-28): in thread mode the writer shares the
rank's GIL, and a save's allocations run the collector on the writer thread; a full collection of an unsettled
rank (~347 000 objects) took 224-505 ms there, and one ran inside a 726 ms step of a thread-mode save (4x256
GPT, --no-settle); settled, the same collection takes ~0.01 ms. `musubi train` settles its heap, so the bench
does too; the single 270-330 ms steps of thread mode on 2x H200 (session 20, unsettled) most likely were this.
Each rank reports `full_collection_ms` (before and after settling) and every save its collections.

Prints a summary and writes bench-results/checkpoint.json (or --json-out); beside it, NAME.rounds.json holds the
ranks' figures, rewritten after every round (a device call cut short still brings its finished rounds back).

The GPU call that settles issue 46's saves question (2 GPUs, ~3.5 min; the device command in full):
    set -o pipefail; python3 bench/checkpoint.py --nproc 2 --pin --no-recovery --budget-s 200 --step-lists \
        --json-out $OUT/checkpoint-saves.json 2>&1 | grep -v -e ' - INFO - ' -e Warning | tail -40
and the copy-ahead lever after it (same length): add `--writer-nice 10 --writer-copy-ahead-mb 10,0`.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from musubi.contract.env import MUSUBI_CPUS  # noqa: E402

SHAPES = {
    "gpu": {"layers": 12, "hidden": 1024, "heads": 16, "vocab": 8192, "seq_len": 256, "batch": 8},
    # a CPU probe of the GPU shape's proportions: much state (a wide embedding, ~2.5 M parameters, ~30 MB a rank
    # with AdamW) for a short step (32 tokens), so that several steps run while one save is in flight
    "mid": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 16384, "seq_len": 16, "batch": 2},
    "tiny": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32, "batch": 4},
}
TARGET_BLOCKED = 0.05  # of a synchronous save (issue 46)
TARGET_THROUGHPUT = 0.95  # of the steady step's speed while a save is in flight (issue 46)
TEARDOWN_S = 15.0  # of --budget-s kept for the ranks' ends and the launcher's report


def job_dict(shape: dict, cpu: bool, every: int, steps: int) -> dict:
    """The bench's job: the built-in GPT on synthetic tokens, AdamW, DDP."""
    return {
        "name": "ckpt-bench", "task": "lm", "model": "gpt",
        "model_args": {"layers": shape["layers"], "hidden": shape["hidden"], "heads": shape["heads"]},
        "data": {"synthetic": {"train_size": 100_000, "val_size": 0, "seq_len": shape["seq_len"],
                               "vocab": shape["vocab"]}, "workers": 1},
        "train": {"epochs": 1, "max_steps": steps, "batch": shape["batch"], "optimizer": "adamw", "lr": 1e-4,
                  "base_batch": shape["batch"], "precision": "fp32" if cpu else "bf16", "log_every": 5,
                  "max_restarts": 2},
        # keep_last 1: dozens of saves of ~2 GB a rank must not fill the device machine's disk
        "checkpoint": {"every_steps": every, "keep_last": 1},
        "watchdog": {"floor_s": 60},
    }


# -- what the launcher and the tests share: the variants, their order, the verdicts ---------------------------
def variants(modes: str, nices: str, aheads: str = "") -> list[tuple[str, str, int, int | None]]:
    """(label, async mode, writer nice, writer copy-ahead in bytes or None for DCP's) of every variant:
    `mode/niceN` for each mode and nice, `mode/niceN/aheadM` (M in MB) when copy-aheads are listed."""
    ahead = [float(x) for x in str(aheads).split(",") if x.strip()]
    return [(f"{m}/nice{n}" + (f"/ahead{a:g}" if ahead else ""), m, n, int(a * 1e6) if ahead else None)
            for m in modes.split(",") if m for n in (int(x) for x in str(nices).split(",") if x.strip())
            for a in (ahead or [None])]


def paired_base(label: str, labels: list[str], part: str) -> str | None:
    """The label `label` is paired with along `part` ("nice": nice 0; "ahead": the first copy-ahead listed),
    None when `label` is that base itself or the base was not measured."""
    parts = label.split("/")
    i = next((k for k, x in enumerate(parts) if x.startswith(part)), None)
    if i is None:
        return None
    firsts = [x.split("/")[i] for x in labels if len(x.split("/")) == len(parts)]
    base_part = f"{part}0" if part == "nice" else firsts[0]
    base = "/".join(parts[:i] + [base_part] + parts[i + 1:])
    return base if base != label and base in labels else None


def round_order(labels: list[str], seed: int, round_no: int) -> list[str]:
    """The variants' order in round `round_no`: shuffled by a generator seeded with (seed, round), the same on
    every rank (they must save in the same order) and in every rerun."""
    order = list(labels)
    random.Random(f"{seed}/{round_no}").shuffle(order)
    return order


def median_interval(values: list[float], coverage: float = 0.95) -> tuple[float, float, float]:
    """(low, high, its coverage): the narrowest pair of order statistics x(k)..x(n+1-k) that holds the median
    with probability >= `coverage` (binomial, no assumption on the distribution); min..max when even that
    falls short (5 values: 93.75 %)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0.0

    def cover(k: int) -> float:  # P(x(k) <= median <= x(n+1-k)) = 1 - 2 P(Bin(n, 1/2) <= k - 1)
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and cover(k + 1) >= coverage:
        k += 1
    return xs[k - 1], xs[n - k], cover(k)


#: Rounds a verdict needs: the min..max of 5 rounds holds their median with 94 % probability, of 3 only 75 %.
VERDICT_ROUNDS = 5


def verdict(values: list[float], target: float, higher_is_better: bool, min_rounds: int = VERDICT_ROUNDS) -> str:
    """'meets' / 'misses' when the median's interval lies wholly on one side of `target`, else 'not settled'
    (with why): an interval that straddles the target, or fewer than `min_rounds` values."""
    if len(values) < min_rounds:
        return f"not settled ({len(values)} round(s), {min_rounds} needed)"
    lo, hi, _ = median_interval(values)

    def good(v: float) -> bool:
        return v >= target if higher_is_better else v <= target

    if good(lo) and good(hi):
        return "meets"
    if not good(lo) and not good(hi):
        return "misses"
    return f"not settled (the median's interval {lo:.3f}..{hi:.3f} spans the target {target})"


def summarise(saves: list[dict[str, Any]], sync_save_s: float, labels: list[str]) -> dict[str, Any]:
    """Per variant: throughput during a save and blocked/sync, median and interval over rounds, with verdicts;
    per mode, each nice against nice 0 paired by round (throughput points, + means faster during the save)."""
    out: dict[str, Any] = {}
    for label in labels:
        mine = [s for s in saves if s["variant"] == label]
        thr = [s["throughput"] for s in mine if s["throughput"] is not None]
        blk = [s["blocked_s"] / sync_save_s for s in mine]
        row: dict[str, Any] = {"rounds": len(mine)}
        for name, vals, target, higher in (("throughput", thr, TARGET_THROUGHPUT, True),
                                           ("blocked_vs_sync", blk, TARGET_BLOCKED, False)):
            lo, hi, cov = median_interval(vals)
            row[name] = {"median": round(statistics.median(vals), 4) if vals else None,
                         "interval": [round(lo, 4), round(hi, 4)] if vals else None, "coverage": round(cov, 3),
                         "per_round": [round(v, 4) for v in vals], "verdict": verdict(vals, target, higher)}
        durable = [s["durable_s"] for s in mine if s.get("durable_s") is not None]
        row["durable_s_median"] = round(statistics.median(durable), 3) if durable else None
        row["worst_step_ms"] = max((s["worst_step_ms"] for s in mine if s["worst_step_ms"] is not None), default=None)
        row["gc_in_saves"] = {"gen2": sum(s["gc"]["collections"][2] for s in mine),
                              "all": sum(sum(s["gc"]["collections"]) for s in mine),
                              "max_ms": max((s["gc"]["max_ms"] for s in mine), default=0.0)}
        out[label] = row
    paired: dict[str, Any] = {}
    for label in labels:
        for part in ("nice", "ahead"):
            base = paired_base(label, labels, part)
            if base is None:
                continue
            a = {s["round"]: s["throughput"] for s in saves if s["variant"] == label}
            b = {s["round"]: s["throughput"] for s in saves if s["variant"] == base}
            diffs = [a[r] - b[r] for r in sorted(a) if r in b and a[r] is not None and b[r] is not None]
            lo, hi, cov = median_interval(diffs)
            what = next(x for x in label.split("/") if x.startswith(part))
            paired[f"{label} - {base}"] = {
                "median_points": round(100 * statistics.median(diffs), 2) if diffs else None,
                "interval_points": [round(100 * lo, 2), round(100 * hi, 2)] if diffs else None,
                "coverage": round(cov, 3),
                "reads": ("not settled" if len(diffs) < VERDICT_ROUNDS or lo <= 0 <= hi else
                          f"{part} {what[len(part):]} {'faster' if lo > 0 else 'slower'} during the save")}
    return {"variants": out, "paired": paired}


# -- part 1: inside each rank (started by torchrun) ---------------------------------------------------------
class GcLog:
    """Garbage collections with their times (gc.callbacks, any thread): (start, end, generation, thread)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, float, int, str]] = []
        self._t0: dict[int, float] = {}
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        now, tid = time.perf_counter(), threading.get_ident()
        if phase == "start":
            self._t0[tid] = now
        else:
            self.events.append((self._t0.pop(tid, now), now, info["generation"], threading.current_thread().name))

    def between(self, t0: float, t1: float) -> list[tuple[float, float, int, str]]:
        """The collections that overlap [t0, t1]."""
        return [e for e in self.events if e[1] >= t0 and e[0] <= t1]

    def close(self) -> None:
        """Stop recording."""
        gc.callbacks.remove(self._cb)


def gc_figures(events: list[tuple[float, float, int, str]]) -> dict[str, Any]:
    """Collections per generation, their total and longest milliseconds, and the threads that ran them."""
    count = [0, 0, 0]
    for e in events:
        count[e[2]] += 1
    ms = [1e3 * (e[1] - e[0]) for e in events]
    return {"collections": count, "ms": round(sum(ms), 2), "max_ms": round(max(ms, default=0.0), 2),
            "threads": sorted({e[3] for e in events})}


def timed_ms(fn: Any) -> float:
    """Milliseconds one call of `fn` takes."""
    t0 = time.perf_counter()
    fn()
    return round(1e3 * (time.perf_counter() - t0), 2)


def worker(args: argparse.Namespace) -> None:
    """One rank: steady steps, synchronous saves, then rounds of async saves (every variant) with steps beside."""
    pinned = None
    if args.pin:  # as a `musubi train` rank: its own cores, which DCP's checkpoint process inherits
        from musubi.worker.pinning import pin_rank

        pinned = pin_rank(int(os.environ.get("LOCAL_RANK", "0")))
    import torch
    import torch.distributed as dist

    from musubi.checkpoint.saver import Checkpointer
    from musubi.checkpoint.states import CheckpointStates, Held
    from musubi.checkpoint.writer import WRITER_NICE
    from musubi.config.load import job_from_dict
    from musubi.contract.inject import Injector
    from musubi.contract.world import init_world, shutdown_world
    from musubi.tasks.registry import build_task
    from musubi.worker.trainer import settle_heap
    from musubi.worker.wrap import wrap_model

    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    spec = job_from_dict(json.loads(Path(args.job_json).read_text()))
    world = init_world(600)
    torch.manual_seed(0)
    task = build_task(spec)
    model = wrap_model(task.build_model().to(world.device), "ddp", world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=world.device).manual_seed(world.rank)
    batch = task.device_batch(spec.train.batch, world.device, gen)
    bf16 = world.is_cuda
    flag = torch.zeros(1, device=world.device)

    def step() -> tuple[float, float]:
        """One training step; (start, seconds)."""
        t0 = time.perf_counter()
        with torch.autocast(world.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = task.loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if world.is_cuda:
            torch.cuda.synchronize()
        return t0, time.perf_counter() - t0

    def agreed(mine: bool, op: Any) -> bool:
        """A flag every rank agrees on (all-reduced MIN: all true; MAX: any true)."""
        flag.fill_(1.0 if mine else 0.0)
        dist.all_reduce(flag, op=op)
        return bool(flag.item())

    for _ in range(args.warmup):
        step()
    # What one full collection costs this rank (a stall when it runs inside a step): before the heap is settled,
    # then after (not with --no-settle).
    full_ms = {"unsettled": timed_ms(gc.collect), "tracked_objects": len(gc.get_objects())}
    if not args.no_settle:
        settle_heap()  # as Trainer.fit: set-up's garbage collected, what lives on frozen, the collector on
        full_ms["settled"] = timed_ms(gc.collect)
    gclog = GcLog()
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                       if torch.is_tensor(t))
    steady = [step()[1] for _ in range(args.steps)]
    root = Path(args.ckpt_root)
    inj = Injector(None, world.rank, None)
    out: dict[str, Any] = {"state_gb_per_rank": round(state_bytes / 1e9, 3), "world": world.size,
                           "steady_step_s": statistics.median(steady), "device": str(world.device),
                           "settled_heap": not args.no_settle, "gc_frozen": gc.get_freeze_count(),
                           "full_collection_ms": full_ms,
                           "switch_interval_ms": round(sys.getswitchinterval() * 1e3, 3),
                           "pinned": pinned.describe() if pinned else None, "writer_nice_default": WRITER_NICE}
    if world.is_cuda:
        out["gpu"] = torch.cuda.get_device_name(world.device)

    train = Held({})  # the step of each save: what a trainer's state would hold
    states = CheckpointStates(model, opt, train=train, rank=Held({"seed": torch.tensor([world.rank])}),
                              signature="bench")
    save_no = 0

    def save(saver: Checkpointer) -> None:
        nonlocal save_no
        save_no += 1
        train.state = {"step": save_no}
        saver.save(save_no)

    sync = Checkpointer(root / "sync", spec.checkpoint.model_copy(update={"async_mode": "off"}), world, inj, states)
    sync_s = []
    for _ in range(args.sync_repeats):
        t0 = time.perf_counter()
        save(sync)
        sync_s.append(time.perf_counter() - t0)
    out["sync_save_s"] = statistics.median(sync_s)
    out["sync_saves_s"] = [round(s, 3) for s in sync_s]
    sync.close()

    todo = variants(args.modes, args.writer_nice, args.writer_copy_ahead_mb)
    savers = {}
    t_warm = time.perf_counter()
    for mode in args.modes.split(","):  # the process mode starts its checkpoint process on its first save
        saver = Checkpointer(root / mode, spec.checkpoint.model_copy(update={"async_mode": mode}), world, inj, states)
        save(saver)
        saver.wait()
        saver.drain()
        savers[mode] = saver
    out["warm_up_saves_s"] = round(time.perf_counter() - t_warm, 2)

    def agreed_max(x: float) -> float:
        """The largest `x` of any rank (the step waits for the slowest rank's save to return)."""
        t = torch.tensor([x], dtype=torch.float64, device=world.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def measured(label: str, mode: str, nice: int, ahead: int | None, round_no: int) -> dict[str, Any]:
        """One save against the steps just before it."""
        saver = savers[mode]
        saver.writer_nice = nice
        saver.writer_copy_ahead = ahead
        for _ in range(args.settle_steps):
            agreed(False, dist.ReduceOp.MIN)
            step()
        base = []
        for _ in range(args.base_steps):
            agreed(False, dist.ReduceOp.MIN)  # the same rhythm as the steps during the save, untimed there too
            base.append(step()[1])
        t0 = time.perf_counter()
        save(saver)
        blocked = time.perf_counter() - t0
        during: list[tuple[float, float]] = []
        # Steps while the save is in flight: the training loop's situation. Every rank runs the same number
        # (an all-reduced flag), or DDP's collectives would pair up wrongly.
        while len(during) < args.max_overlap_steps:
            job = saver.inflight
            if agreed(job is None or job.future.done(), dist.ReduceOp.MIN):
                break
            during.append(step())
        saver.wait()
        t1 = time.perf_counter()
        recs = [r for r in saver.drain() if r.get("ok")]
        base_mean = statistics.fmean(base)
        base_med = statistics.median(base)
        worst = max(during, key=lambda s: s[1], default=None)
        stalls = [s for s in during if s[1] > 2 * base_med]  # a step twice the baseline's median: a stall
        gcs = gclog.between(t0, t1)
        out_rec: dict[str, Any] = {
            "variant": label, "mode": mode, "writer_nice": nice, "round": round_no,
            "blocked_s": round(agreed_max(blocked), 4), "base_step_s": round(base_mean, 5),
            "steps_during_save": len(during),
            "step_s_during_save": round(statistics.fmean(s[1] for s in during), 5) if during else None,
            "throughput": round(base_mean / statistics.fmean(s[1] for s in during), 4) if during else None,
            "durable_s": recs[0]["durable_s"] if recs and "durable_s" in recs[0] else None,
            "worst_step_ms": round(1e3 * worst[1], 1) if worst else None,
            "worst_step_gc_ms": round(sum(1e3 * (min(e[1], worst[0] + worst[1]) - max(e[0], worst[0]))
                                          for e in gclog.between(worst[0], worst[0] + worst[1])), 1) if worst else None,
            "stalls": len(stalls), "stall_ms": round(sum(1e3 * (s[1] - base_med) for s in stalls), 1),
            "stall_gc_ms": round(sum(1e3 * (min(e[1], s[0] + s[1]) - max(e[0], s[0]))
                                     for s in stalls for e in gclog.between(s[0], s[0] + s[1])), 1),
            "gc": gc_figures(gcs),
            "step_ms_during_save": [round(1e3 * s[1], 1) for s in during] if args.step_lists else None}
        return out_rec

    saves: list[dict[str, Any]] = []
    longest = 0.0
    labels = [v[0] for v in todo]
    by_label = {v[0]: v for v in todo}
    rounds_run = 0
    for r in range(args.rounds):
        if r >= args.min_rounds and agreed(time.time() + longest > args.deadline, dist.ReduceOp.MAX):
            break  # the next round would end past the budget's deadline (on some rank's clock)
        t_round = time.perf_counter()
        for label in round_order(labels, args.seed, r):
            _, mode, nice, ahead = by_label[label]
            saves.append(measured(label, mode, nice, ahead, r))
        longest = max(longest, time.perf_counter() - t_round)
        rounds_run += 1
        if world.is_main:  # every finished round on disk: a call cut short still leaves its rounds
            Path(args.result).write_text(json.dumps({**out, "rounds": rounds_run, "saves": saves, "partial": True}))
    for saver in savers.values():
        saver.close()
    gclog.close()
    out.update({"rounds": rounds_run, "longest_round_s": round(longest, 2), "saves": saves,
                "orders": [round_order(labels, args.seed, r) for r in range(rounds_run)]})
    if world.is_main:
        Path(args.result).write_text(json.dumps(out, indent=1))
    shutdown_world()


# -- part 2: the launcher -------------------------------------------------------------------------------------
def run_saves(args: argparse.Namespace, spec: dict, tmp: Path, deadline: float) -> dict:
    """One torchrun launch that measures every variant, interleaved by rounds."""
    job_json = tmp / "job.json"
    job_json.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               MUSUBI_DEVICE="cpu" if args.cpu else "cuda")
    if args.pin:
        env[MUSUBI_CPUS] = split_cores(args.nproc)
    # beside --json-out, rewritten after every round: a device call cut short still brings its rounds back
    result = args.json_out.with_name(args.json_out.stem + ".rounds.json")
    result.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           str(Path(__file__).resolve()), "--worker", "--job-json", str(job_json), "--ckpt-root", str(tmp / "ckpt"),
           "--result", str(result), "--modes", args.modes, "--writer-nice", str(args.writer_nice),
           "--writer-copy-ahead-mb", str(args.writer_copy_ahead_mb),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--sync-repeats", str(args.sync_repeats),
           "--settle-steps", str(args.settle_steps), "--base-steps", str(args.base_steps),
           "--max-overlap-steps", str(args.max_overlap_steps), "--rounds", str(args.rounds),
           "--min-rounds", str(args.min_rounds), "--seed", str(args.seed), "--deadline", str(deadline),
           "--switch-interval-ms", str(args.switch_interval_ms)]
    cmd += ["--pin"] * args.pin + ["--no-settle"] * args.no_settle + ["--step-lists"] * args.step_lists
    # the budget plus room for the minimum rounds' overrun; a hung launch must not eat the device call
    limit = max(120.0, args.budget_s * 1.5)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True)
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its ranks (and their checkpoint processes) alike
        proc.wait()
        raise SystemExit(f"the saves launch ran past {limit:.0f} s (1.5x --budget-s) and was ended: "
                         "raise --budget-s or lower --min-rounds") from None
    if rc != 0:
        raise SystemExit(f"the saves launch failed (exit {rc}); its ranks' errors are above")
    return json.loads(result.read_text())


def split_cores(nproc: int) -> str:
    """A MUSUBI_CPUS value: this process's cores split into `nproc` contiguous sets (a `musubi train` pin plan on
    one GPU box splits the machine's cores between its GPUs the same way)."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // nproc)
    return ";".join(",".join(map(str, cores[i * per:(i + 1) * per] or cores[-1:])) for i in range(nproc))


def run_recovery(args: argparse.Namespace, spec: dict, tmp: Path) -> dict:
    """A rank killed mid-run: seconds until the job trains again, from its goodput.json."""
    import yaml

    job = tmp / "recovery.yaml"
    job.write_text(yaml.safe_dump(spec))
    out = tmp / "recovery"
    env = dict(os.environ, MUSUBI_INJECT=f"kill:rank={min(1, args.nproc - 1)},step={args.kill_step}",
               PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "musubi.cli", "train", str(job), "--nproc", str(args.nproc), "--out", str(out),
           "--no-check", "--device", "cpu" if args.cpu else "cuda"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"recovery run failed:\n{res.stdout[-1500:]}\n{res.stderr[-1500:]}")
    good = json.loads((out / "ckpt-bench" / "goodput.json").read_text())
    failures = good["failures"]
    return {"wall_s": round(wall, 1), "failures": len(failures),
            "back_to_training_s": failures[0]["downtime_s"] if failures else None,
            "lost_steps": good["lost_steps"], "cause": failures[0]["detail"] if failures else None,
            "goodput": good["goodput"]}


# -- part 3: the GIL probe (one process, no torchrun) ---------------------------------------------------------
def gil_probe(args: argparse.Namespace) -> dict[str, Any]:
    """What a thread-mode save costs a GPU-like step on the CPU: the GIL, not the cores.

    A GPU rank's step holds the GIL only to dispatch its kernels and sleeps (GIL released) while the device
    computes. Emulated here: `--probe-ops` small in-place tensor ops (each takes the GIL, like a kernel launch)
    then `--probe-wait-ms` of sleep (a device sync). Beside it, DCP saves of `--probe-mb` of host tensors run
    from a thread (what thread mode's writer does, without the collectives), interleaved by rounds over the
    writer's nice (`--writer-nice`) and the interpreter's switch interval (`--probe-switch-ms`, set per save).
    Per save: its steps' mean time against the steps just before it, and the collections inside it.
    """
    import torch
    import torch.distributed.checkpoint as dcp

    from musubi.checkpoint.writer import BackgroundWriter
    from musubi.worker.trainer import settle_heap

    n = max(1, int(args.probe_mb * 1e6 / 4 / 64))  # 64 tensors of float32
    state = {f"t{i}": torch.randn(n) for i in range(64)}
    x = torch.zeros(64)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        for _ in range(args.probe_ops):
            x.add_(1.0)
        time.sleep(args.probe_wait_ms / 1e3)
        return t0, time.perf_counter() - t0

    if not args.no_settle:
        settle_heap()
    gclog = GcLog()
    labels = [f"nice{n}/switch{sw:g}ms" for n in (int(v) for v in str(args.writer_nice).split(","))
              for sw in (float(v) for v in str(args.probe_switch_ms).split(","))]
    tmp = Path(tempfile.mkdtemp(prefix="musubi-gil-probe-"))
    default_switch = sys.getswitchinterval()
    saves = []
    for r in range(args.rounds):
        for label in round_order(labels, args.seed, r):
            nice, switch = int(label.split("/")[0][4:]), float(label.split("switch")[1][:-2])
            base = [step()[1] for _ in range(args.base_steps)]
            sys.setswitchinterval(switch / 1e3)
            d = tmp / f"r{r}-{label.replace('/', '-')}"
            th = threading.Thread(target=lambda d=d, nice=nice: dcp.save(
                state, storage_writer=BackgroundWriter(str(d), nice), no_dist=True), name="probe-writer")
            t0 = time.perf_counter()
            th.start()
            during = []
            while th.is_alive():
                during.append(step())
            t1 = time.perf_counter()
            sys.setswitchinterval(default_switch)
            th.join()
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
            mean = statistics.fmean(s[1] for s in during) if during else None
            saves.append({"variant": label, "round": r, "save_s": round(t1 - t0, 3), "steps": len(during),
                          "base_step_s": round(statistics.fmean(base), 5),
                          "throughput": round(statistics.fmean(base) / mean, 4) if mean else None,
                          "worst_step_ms": round(1e3 * max(s[1] for s in during), 1) if during else None,
                          "gc": gc_figures(gclog.between(t0, t1))})
    gclog.close()
    rows = {}
    for label in labels:
        thr = [s["throughput"] for s in saves if s["variant"] == label and s["throughput"] is not None]
        lo, hi, cov = median_interval(thr)
        rows[label] = {"throughput_median": round(statistics.median(thr), 4) if thr else None,
                       "interval": [round(lo, 4), round(hi, 4)], "coverage": round(cov, 3),
                       "save_s_median": statistics.median(s["save_s"] for s in saves if s["variant"] == label),
                       "worst_step_ms": max((s["worst_step_ms"] or 0) for s in saves if s["variant"] == label)}
    return {"probe": {"mb": args.probe_mb, "ops": args.probe_ops, "wait_ms": args.probe_wait_ms,
                      "settled_heap": not args.no_settle}, "rows": rows, "saves": saves}


def default_label(cpu: bool, labels: list[str], nice: int | None = None) -> str:
    """The variant a job gets with nothing set: async_mode auto (process on GPU ranks, thread on CPU ranks), the
    writer's default nice (`nice`: as the ranks reported it, so that this launcher never imports torch for it)
    and DCP's default copy-ahead (10 MB, where copy-aheads are compared)."""
    if nice is None:
        from musubi.checkpoint.writer import WRITER_NICE as nice

    label = f"{'thread' if cpu else 'process'}/nice{nice}"
    return label if label in labels or f"{label}/ahead10" not in labels else f"{label}/ahead10"


def print_report(result: dict[str, Any], args: argparse.Namespace) -> None:
    """The summary: the launch's figures, one line a variant, the paired nice comparisons, the default's verdict."""
    s = result["saves"]
    summ = result["summary"]
    print(f"checkpoint saves probe: {s.get('gpu', s['device'])} x{args.nproc}, state {s['state_gb_per_rank']} GB "
          f"per rank (model + AdamW), steady step {s['steady_step_s'] * 1e3:.1f} ms, sync save "
          f"{s['sync_save_s']:.2f} s; heap {'settled' if s['settled_heap'] else 'NOT settled'} (a full collection "
          f"of its {s['full_collection_ms']['tracked_objects']} objects {s['full_collection_ms']['unsettled']} ms, "
          f"settled {s['full_collection_ms'].get('settled', 'n/a')} ms); "
          f"{s['rounds']} round(s) of {len(summ['variants'])} variants (longest {s['longest_round_s']} s), "
          f"order shuffled per round (seed {args.seed})")
    for label, v in summ["variants"].items():
        t, b = v["throughput"], v["blocked_vs_sync"]
        if t["median"] is None:
            print(f"  {label:14s} no steps ran during its saves (saves shorter than a step)")
            continue
        print(f"  {label:14s} throughput during save {t['median']:.1%} [{t['interval'][0]:.1%}..{t['interval'][1]:.1%},"
              f" {t['coverage']:.0%}] {t['verdict']}; blocked {b['median']:.1%} of sync "
              f"[{b['interval'][0]:.1%}..{b['interval'][1]:.1%}] {b['verdict']}; durable {v['durable_s_median']} s; "
              f"worst step {v['worst_step_ms']} ms; gc in saves {v['gc_in_saves']}")
    for name, p in summ["paired"].items():
        if p["median_points"] is not None:
            print(f"  {name}: {p['median_points']:+.1f} points [{p['interval_points'][0]:+.1f}.."
                  f"{p['interval_points'][1]:+.1f}, {p['coverage']:.0%}]: {p['reads']}")
    d = summ["variants"].get(result["default_variant"])
    if d is not None:
        print(f"  default ({result['default_variant']}, async_mode auto): throughput {d['throughput']['verdict']}, "
              f"blocked {d['blocked_vs_sync']['verdict']} (targets >= {TARGET_THROUGHPUT:.0%}, <= {TARGET_BLOCKED:.0%})")
    rec = result.get("recovery")
    if rec:
        print(f"  recovery: a killed rank's job back to training after {rec['back_to_training_s']} s "
              f"(target <= 60 s); cause: {rec['cause']}; {rec['lost_steps']} step(s) redone")


def end_now() -> None:
    """Leave with everything written, skipping the interpreter's teardown: with torch imported it is seconds of
    garbage collection over its modules (a rank here waited ~8 s for it under load; musubi's ranks skip it too)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="CPU ranks on gloo (tiny shape unless --shape)")
    ap.add_argument("--tiny", action="store_true", help="the tiny GPT (same as --shape tiny)")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="model size: gpu (~1.9 GB a rank), mid, tiny")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--modes", default="process,thread", help="async modes to measure")
    ap.add_argument("--writer-nice", default="0,10", help="nices of the save's writing thread to measure "
                    "(comma list; 0: the rank's own priority)")
    ap.add_argument("--writer-copy-ahead-mb", default="",
                    help="DCP copy-aheads of the writer to compare, MB (e.g. 10,0; 0: no CUDA call in the writer); "
                         "default: DCP's, not a variant")
    ap.add_argument("--budget-s", type=float, default=200.0,
                    help="seconds for the saves launch, start-up included: rounds are planned to fit")
    ap.add_argument("--rounds", type=int, default=20, help="at most this many rounds")
    ap.add_argument("--min-rounds", type=int, default=VERDICT_ROUNDS,
                    help="at least this many rounds, budget or not (a verdict needs 5)")
    ap.add_argument("--seed", type=int, default=0, help="seeds each round's order of the variants")
    ap.add_argument("--steps", type=int, default=20, help="steady steps timed once after the warm-up")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--sync-repeats", type=int, default=2)
    ap.add_argument("--settle-steps", type=int, default=3, help="untimed steps before each save's baseline")
    ap.add_argument("--base-steps", type=int, default=20, help="steps timed just before each save: its baseline")
    ap.add_argument("--max-overlap-steps", type=int, default=500)
    ap.add_argument("--no-settle", action="store_true", help="leave the heap unfrozen (this bench before session 21)")
    ap.add_argument("--switch-interval-ms", type=float, default=0.0,
                    help="sys.setswitchinterval in the ranks (0: Python's 5 ms), a GIL experiment")
    ap.add_argument("--step-lists", action="store_true", help="every save's step times in the JSON")
    ap.add_argument("--gil-probe", action="store_true",
                    help="instead of the saves launch: the GIL probe in this process (see gil_probe)")
    ap.add_argument("--probe-mb", type=float, default=200.0, help="GIL probe: megabytes a save writes")
    ap.add_argument("--probe-ops", type=int, default=300, help="GIL probe: tensor ops a step dispatches")
    ap.add_argument("--probe-wait-ms", type=float, default=30.0, help="GIL probe: a step's sleep (the device)")
    ap.add_argument("--probe-switch-ms", default="5,0.5", help="GIL probe: switch intervals to interleave")
    ap.add_argument("--kill-step", type=int, default=12)
    ap.add_argument("--no-recovery", action="store_true")
    ap.add_argument("--pin", action="store_true", help="pin each rank to its share of the cores, as musubi train")
    ap.add_argument("--json-out", type=Path, default=REPO / "bench-results" / "checkpoint.json")
    # worker side
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--job-json", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt-root", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=math.inf, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        end_now()
    bad = [m for m in args.modes.split(",") if m not in ("process", "thread")]
    if bad or not args.modes:
        raise SystemExit(f"--modes {args.modes!r}: async modes are process and thread (a comma list of them)")
    for flag, value, parse in (("--writer-nice", args.writer_nice, int), ("--writer-copy-ahead-mb",
                                                                          args.writer_copy_ahead_mb, float)):
        try:
            [parse(x) for x in str(value).split(",") if x.strip()]
        except ValueError:
            raise SystemExit(f"{flag} {value!r}: give numbers separated by commas, e.g. 0,10") from None
    todo = variants(args.modes, args.writer_nice, args.writer_copy_ahead_mb)
    if not todo or args.min_rounds < 1 or args.rounds < args.min_rounds:
        raise SystemExit("--writer-nice needs a value, and 1 <= --min-rounds <= --rounds")
    if args.gil_probe:
        probe = gil_probe(args)
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(probe, indent=1))
        for label, row in probe["rows"].items():
            print(f"  GIL probe {label:18s} step throughput during a save {row['throughput_median']:.1%} "
                  f"[{row['interval'][0]:.1%}..{row['interval'][1]:.1%}, {row['coverage']:.0%}]; save "
                  f"{row['save_s_median']:.2f} s; worst step {row['worst_step_ms']} ms")
        print(f"  -> {args.json_out}")
        end_now()
    shape = SHAPES[args.shape or ("tiny" if args.tiny or args.cpu else "gpu")]
    spec = job_dict(shape, args.cpu, every=5, steps=max(args.kill_step + 8, 20))
    tmp = Path(tempfile.mkdtemp(prefix="musubi-ckpt-bench-"))
    t0 = time.perf_counter()
    deadline = time.time() + args.budget_s - TEARDOWN_S
    print(f"saves probe: {len(todo)} variants ({', '.join(v[0] for v in todo)}) x {args.min_rounds}..{args.rounds} "
          f"rounds, each started while the longest round so far still ends {TEARDOWN_S:.0f} s before the "
          f"{args.budget_s:.0f} s budget", flush=True)
    saves = run_saves(args, spec, tmp, deadline)
    saves_s = round(time.perf_counter() - t0, 1)
    recovery = None if args.no_recovery else run_recovery(args, spec, tmp)
    result = {"shape": shape, "nproc": args.nproc, "cpu": args.cpu, "budget_s": args.budget_s, "saves_s": saves_s,
              "default_variant": default_label(args.cpu, [v[0] for v in todo], saves.get("writer_nice_default")),
              "summary": summarise(saves["saves"], saves["sync_save_s"], [v[0] for v in todo]),
              "saves": saves, "recovery": recovery, "seconds": round(time.perf_counter() - t0, 1), "dir": str(tmp),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=1))
    print_report(result, args)
    print(f"  saves launch {saves_s} s of a {args.budget_s:.0f} s budget -> {args.json_out}")


if __name__ == "__main__":
    main()
