"""Asynchronous checkpoints on real GPUs: time blocked, step throughput during a save, recovery time.

    python bench/checkpoint.py [--nproc 4] [--modes process,thread]     # GPUs (the lead's run)
    python bench/checkpoint.py --cpu --nproc 2 --tiny                   # proves it runs, on CPU ranks
    python bench/checkpoint.py --nproc 2 --pin --writer-nice 0,10 --no-recovery   # the writer's priority

Model: the built-in GPT (`task: lm`) at 12 layers x 1024 wide, vocab 8192 (~160 M parameters; with
AdamW's two moments ~1.9 GB of state, replicated by DDP on every GPU). Everything measured in one run:

1. save (torchrun, `--nproc` ranks): steady step time; a synchronous save (musubi's Checkpointer,
   `async_mode: off`: the step waits for the whole write and the commit); then per async mode a
   warm-up save (the process mode starts its daemon) and a timed save: time the step was blocked,
   the steps run while the save was in flight (their mean time vs the steady one), time to durable.
   Targets (issue #9): blocked <= 5 % of the synchronous save; throughput during a save >= 95 %.
   `--writer-nice 0,10` measures each mode once per nice of the save's writing thread (musubi's default
   10, checkpoint/writer.py; 0: the rank's own priority), one launch each; `--pin` pins each rank to its
   share of the cores as `musubi train` does, so the writer (which inherits them) competes with the step
   as in training. Each variant also lists the steps' times during the save, in order (ms).
2. recovery: `musubi train` of the same model with `MUSUBI_INJECT=kill:rank=1,step=K`; from the
   job's goodput.json, the seconds from the failure to the next attempt's first step. Target <= 60 s.

Prints a summary and writes bench-results/checkpoint.json (or --json-out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from musubi.contract.env import MUSUBI_CPUS  # noqa: E402

GPU_SHAPE = {"layers": 12, "hidden": 1024, "heads": 16, "vocab": 8192, "seq_len": 256, "batch": 8}
TINY_SHAPE = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32, "batch": 4}


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
        "checkpoint": {"every_steps": every},
        "watchdog": {"floor_s": 60},
    }


# -- part 1: inside each rank (started by torchrun) ---------------------------------------------
def worker(args: argparse.Namespace) -> None:
    """One rank: steady steps, a synchronous save, then async saves with steps running beside them."""
    import torch

    from musubi.checkpoint.saver import Checkpointer
    from musubi.checkpoint.states import CheckpointStates, Held
    from musubi.config.load import job_from_dict
    from musubi.contract.inject import Injector
    from musubi.contract.world import init_world, shutdown_world
    from musubi.tasks.registry import build_task
    from musubi.worker.wrap import wrap_model

    spec = job_from_dict(json.loads(Path(args.job_json).read_text()))
    pinned = None
    if args.pin:  # as a `musubi train` rank: its own cores, which DCP's checkpoint process inherits
        from musubi.worker.pinning import pin_rank

        pinned = pin_rank(int(os.environ.get("LOCAL_RANK", "0")))
    world = init_world(600)
    torch.manual_seed(0)
    task = build_task(spec)
    model = wrap_model(task.build_model().to(world.device), "ddp", world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=world.device).manual_seed(world.rank)
    batch = task.device_batch(spec.train.batch, world.device, gen)
    bf16 = world.is_cuda

    def step() -> float:
        t0 = time.perf_counter()
        with torch.autocast(world.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = task.loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if world.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(args.warmup):
        step()
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                       if torch.is_tensor(t))
    steady = [step() for _ in range(args.steps)]
    root = Path(args.ckpt_root)
    inj = Injector(None, world.rank, None)
    out: dict = {"state_gb_per_rank": round(state_bytes / 1e9, 3), "world": world.size,
                 "steady_step_s": statistics.median(steady), "device": str(world.device)}
    if world.is_cuda:
        out["gpu"] = torch.cuda.get_device_name(world.device)

    train = Held({})  # the step of each save: what a trainer's state would hold
    states = CheckpointStates(model, opt, train=train, rank=Held({"seed": torch.tensor([world.rank])}),
                              signature="bench")

    def save(saver: Checkpointer, step: int) -> None:
        train.state = {"step": step}
        saver.save(step)

    sync = Checkpointer(root / "sync", spec.checkpoint.model_copy(update={"async_mode": "off"}), world, inj, states)
    sync_s = []
    for i in range(args.sync_repeats):
        t0 = time.perf_counter()
        save(sync, 1000 + i)
        sync_s.append(time.perf_counter() - t0)
    out["sync_save_s"] = statistics.median(sync_s)
    sync.close()

    for mode in args.modes.split(","):
        saver = Checkpointer(root / mode, spec.checkpoint.model_copy(update={"async_mode": mode}), world, inj, states)
        saver.writer_nice = args.writer_nice
        save(saver, 1)  # warm-up: the process mode starts its daemon here
        saver.wait()
        saver.drain()
        blocked, during, durable = [], [], []
        for i in range(args.async_repeats):
            t0 = time.perf_counter()
            save(saver, 2 + i)
            blocked.append(time.perf_counter() - t0)
            n = 0
            # Steps while the save is in flight: the training loop's situation. Every rank runs the
            # same number (an all-reduced flag), or DDP's collectives would pair up wrongly.
            while n < args.max_overlap_steps:
                done = torch.tensor([1 if saver.inflight is None or saver.inflight.future.done() else 0],
                                    device=world.device)
                torch.distributed.all_reduce(done, op=torch.distributed.ReduceOp.MIN)
                if done.item():
                    break
                during.append(step())
                n += 1
            saver.wait()
            recs = [r for r in saver.drain() if r.get("ok")]
            durable += [r["durable_s"] for r in recs if "durable_s" in r]
        saver.close()
        out[mode] = {"blocked_s": statistics.median(blocked),
                     "blocked_vs_sync": statistics.median(blocked) / out["sync_save_s"],
                     "steps_during_save": len(during),
                     "step_s_during_save": statistics.mean(during) if during else None,
                     "throughput_during_save": (out["steady_step_s"] / statistics.mean(during)) if during else None,
                     "durable_s": statistics.median(durable) if durable else None,
                     "writer_nice": args.writer_nice, "pinned": pinned.describe() if pinned else None,
                     "step_ms_during_save": [round(1e3 * t, 1) for t in during]}
    if world.is_main:
        Path(args.result).write_text(json.dumps(out, indent=1))
    shutdown_world()


# -- part 2: the launcher -----------------------------------------------------------------------
def run_saves(args: argparse.Namespace, spec: dict, tmp: Path) -> dict:
    """One torchrun launch per async mode (a job uses one mode; DCP's daemon lives as long as its rank)."""
    job_json = tmp / "job.json"
    job_json.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               MUSUBI_DEVICE="cpu" if args.cpu else "cuda")
    if args.pin:
        env[MUSUBI_CPUS] = split_cores(args.nproc)
    merged: dict = {}
    for label, mode, nice in variants(args):
        result = tmp / f"saves-{label.replace('/', '-')}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               str(Path(__file__).resolve()), "--worker", "--job-json", str(job_json), "--ckpt-root",
               str(tmp / "ckpt" / label), "--result", str(result), "--modes", mode, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--sync-repeats", str(args.sync_repeats),
               "--async-repeats", str(args.async_repeats), "--max-overlap-steps", str(args.max_overlap_steps),
               "--writer-nice", str(nice)] + (["--pin"] if args.pin else [])
        subprocess.run(cmd, check=True, env=env, cwd=REPO, timeout=600)
        one = json.loads(result.read_text())
        one[mode]["sync_save_s"] = one["sync_save_s"]  # the baseline of the same launch
        one[mode]["steady_step_s"] = one["steady_step_s"]
        merged = {**one, **merged, label: one[mode]}
    return merged


def variants(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(label, async mode, writer nice) per launch: the mode alone when one nice is measured, else mode/niceN."""
    nices = [int(n) for n in str(args.writer_nice).split(",") if n.strip()]
    return [(mode if len(nices) == 1 else f"{mode}/nice{n}", mode, n)
            for mode in args.modes.split(",") for n in nices]


def split_cores(nproc: int) -> str:
    """A MUSUBI_CPUS value: this process's cores split into `nproc` contiguous sets (a `musubi train` pin plan on
    one GPU box splits the machine's cores between its GPUs the same way)."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // nproc)
    return ";".join(",".join(map(str, cores[i * per:(i + 1) * per] or cores[-1:])) for i in range(nproc))


def run_recovery(args: argparse.Namespace, spec: dict, tmp: Path) -> dict:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="CPU ranks on gloo (a check that the bench runs)")
    ap.add_argument("--tiny", action="store_true", help="a tiny GPT instead of the ~1.9 GB one")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--modes", default="process,thread", help="async modes to measure")
    ap.add_argument("--steps", type=int, default=20, help="steady steps timed")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--sync-repeats", type=int, default=2)
    ap.add_argument("--async-repeats", type=int, default=2)
    ap.add_argument("--max-overlap-steps", type=int, default=500)
    ap.add_argument("--kill-step", type=int, default=12)
    ap.add_argument("--no-recovery", action="store_true")
    ap.add_argument("--writer-nice", default="10",
                    help="nice of the save's writing thread, or a comma list to measure each (0: the rank's own)")
    ap.add_argument("--pin", action="store_true", help="pin each rank to its share of the cores, as musubi train")
    ap.add_argument("--json-out", type=Path, default=REPO / "bench-results" / "checkpoint.json")
    # worker side
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--job-json", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt-root", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.writer_nice = int(args.writer_nice)
        worker(args)
        return
    shape = TINY_SHAPE if args.tiny or args.cpu else GPU_SHAPE
    spec = job_dict(shape, args.cpu, every=5, steps=max(args.kill_step + 8, 20))
    tmp = Path(tempfile.mkdtemp(prefix="musubi-ckpt-bench-"))
    t0 = time.perf_counter()
    saves = run_saves(args, spec, tmp)
    recovery = None if args.no_recovery else run_recovery(args, spec, tmp)
    result = {"shape": shape, "nproc": args.nproc, "cpu": args.cpu, "saves": saves, "recovery": recovery,
              "seconds": round(time.perf_counter() - t0, 1), "dir": str(tmp),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=1))
    s = saves
    print(f"checkpoint bench: {s.get('gpu', s['device'])} x{args.nproc}, state {s['state_gb_per_rank']} GB per rank "
          f"(model + AdamW), steady step {s['steady_step_s'] * 1e3:.1f} ms")
    for mode, _, _ in variants(args):
        m = s[mode]
        thr = f"{m['throughput_during_save']:.1%}" if m["throughput_during_save"] is not None else "n/a"
        print(f"  async {mode:7s} (writer nice {m['writer_nice']}): blocked {m['blocked_s'] * 1e3:.0f} ms = {m['blocked_vs_sync']:.1%} of the "
              f"{m['sync_save_s']:.2f} s sync save "
              f"(target <= 5%); throughput during save {thr} over {m['steps_during_save']} steps "
              f"(target >= 95%); durable after {m['durable_s'] or float('nan'):.2f} s")
    if recovery:
        print(f"  recovery: a killed rank's job back to training after {recovery['back_to_training_s']} s "
              f"(target <= 60 s); cause: {recovery['cause']}; {recovery['lost_steps']} step(s) redone")
    print(f"  -> {args.json_out}")


if __name__ == "__main__":
    main()
