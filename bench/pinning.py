"""Rank pinning benchmark: per-rank step-time tail and throughput of FCOS fed from real JPEG files, pinned vs not.

Writes 256 1920x1080 JPEGs to local disk (a minimal generator: smooth
colour fields, shapes and noise, so they decode like photos), then trains
torchvision's fcos_resnet50_fpn with DDP under torchrun, every rank decoding
its own images in data-loader workers: each sample is a 2x2 mosaic of four
decoded, antialias-resized JPEGs on a 1333x749 canvas (YOLO-style input, the
CPU contention a fleet of detectors sees). Two arms, same worker count, same steps, run in the order
A B B A (drift cancels):

- unpinned: what Musubi did before pinning: no affinity, OMP_NUM_THREADS =
  cores / ranks, every rank and worker free to run on any core;
- pinned: Musubi's plan (launch/pin_plan.py: the cores of each GPU's NUMA
  node split between the GPUs, MUSUBI_CPUS, torchrun --numa-binding=node where
  torch and numactl allow), applied by each rank (worker/pinning.py) before
  torch starts its threads; intra-op threads = cores - workers.

Each rank times every step (data wait + H2D + forward/backward/optimizer, a
CUDA sync at the end of each timed step in both arms) after the warm-up steps.
Reported per arm: per-rank coefficient of variation and p99/p50 of step time
(the worst rank), and samples/s over the timed steps. Targets (issue #12):
pinned p99/p50 and CV no worse, throughput >= 1.05x unpinned.

    python bench/pinning.py [--gpus 4] [--steps 60] [--warmup 10] [--images 320] [--json OUT.json]
    python bench/pinning.py --cpu --steps 5      # tiny CPU mode (gloo, small images): proves it runs
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


# -- data: a minimal JPEG generator ---------------------------------------------------------------
def write_jpegs(root: Path, n: int, width: int, height: int, seed: int = 0) -> list[Path]:
    """n photo-like JPEGs (quality 90) of width x height; existing files of the same size are reused."""
    import torch
    import torch.nn.functional as F
    from torchvision.io import encode_jpeg

    root.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    paths = []
    for i in range(n):
        p = root / f"img{i:05d}_{width}x{height}.jpg"
        paths.append(p)
        if p.is_file():
            continue
        # A coarse colour field upsampled (sky, ground), a few flat boxes (objects), fine noise (texture).
        base = torch.rand(1, 3, 6, 10, generator=g)
        img = F.interpolate(base, size=(height, width), mode="bicubic", align_corners=False)[0]
        for _ in range(6):
            w, h = int(torch.randint(width // 20, width // 5, (1,), generator=g)), int(
                torch.randint(height // 20, height // 5, (1,), generator=g))
            x, y = int(torch.randint(0, width - w, (1,), generator=g)), int(torch.randint(0, height - h, (1,),
                                                                                           generator=g))
            img[:, y:y + h, x:x + w] = torch.rand(3, 1, 1, generator=g)
        img = img + 0.06 * torch.randn(img.shape, generator=g)
        p.write_bytes(encode_jpeg((img.clamp(0, 1) * 255).to(torch.uint8), quality=90).numpy().tobytes())
    return paths


# -- one rank (under torchrun) ---------------------------------------------------------------------
class JpegBoxes:
    """JPEG files -> (uint8 CHW canvas `side` wide, 16:9, random boxes fixed by index).

    Each sample decodes `decodes` files and tiles them (YOLO-style mosaic, 2x2 for 4: the CPU-heavy
    input of the story's detector fleet), each tile resized with antialiasing.
    """

    def __init__(self, files: list[str], side: int, classes: int, decodes: int, length: int) -> None:
        self.files, self.side, self.classes, self.decodes = files, side, classes, decodes
        self.length = length  # samples cycle over the files: one epoch covers the run (no epoch-start stalls)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        import math

        import torch
        import torch.nn.functional as F
        from torchvision.io import decode_jpeg, read_file

        W, H = self.side, self.side * 9 // 16
        grid = math.ceil(math.sqrt(self.decodes))
        tw, th = W // grid, H // grid
        canvas = torch.zeros(3, H, W, dtype=torch.uint8)
        for k in range(self.decodes):
            img = decode_jpeg(read_file(self.files[(i + k) % len(self.files)]))  # CPU decode: the contended work
            tile = F.interpolate(img[None].float(), size=(th, tw), mode="bilinear", antialias=True,
                                 align_corners=False)[0].clamp(0, 255).to(torch.uint8)
            if (i + k) % 2:
                tile = tile.flip(-1)
            y, x = divmod(k, grid)
            canvas[:, y * th:(y + 1) * th, x * tw:(x + 1) * tw] = tile
        g = torch.Generator().manual_seed(i)
        xy = torch.rand(4, 2, generator=g) * torch.tensor([W * 0.8, H * 0.8])
        wh = 8 + torch.rand(4, 2, generator=g) * torch.tensor([W * 0.2, H * 0.2])
        boxes = torch.cat([xy, xy + wh], 1)
        labels = torch.randint(1, self.classes, (4,), generator=g)
        return canvas, {"boxes": boxes, "labels": labels}


def _collate(batch):
    return [b[0] for b in batch], [b[1] for b in batch]


def rank_main(args: argparse.Namespace) -> None:
    """One DDP rank: pin (pinned arm), train, time each step, gather every rank's times on rank 0."""
    from musubi.worker.pinning import intra_op_threads, pin_rank

    local = int(os.environ.get("LOCAL_RANK", "0"))
    pinned = pin_rank(local) if args.arm == "pinned" else None  # first thing, as the Musubi worker does
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler
    from torchvision.models.detection import fcos_resnet50_fpn

    cuda = not args.cpu
    if cuda:
        torch.cuda.set_device(local)
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if pinned is not None:
        torch.set_num_threads(intra_op_threads(pinned.cores, args.workers))
    files = sorted(str(p) for p in Path(args.data).glob("*.jpg"))
    total = args.warmup + args.steps
    ds = JpegBoxes(files, args.side, 91, args.decodes, length=world * args.batch * (total + 2))
    sampler = DistributedSampler(ds, world, rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=args.workers, collate_fn=_collate,
                        pin_memory=cuda, drop_last=True, persistent_workers=args.workers > 0,
                        prefetch_factor=2 if args.workers > 0 else None)
    model = fcos_resnet50_fpn(weights=None, weights_backbone=None, num_classes=91, min_size=args.side * 9 // 16,
                              max_size=args.side).to(dev)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    torch.backends.cudnn.benchmark = True
    times, waits = [], []
    epoch = 0
    sampler.set_epoch(epoch)
    it = iter(loader)
    dist.barrier()
    t_wall = time.perf_counter()
    for step in range(total):
        if step == args.warmup:  # kernels, cudnn autotuning, allocator and loader workers are warm: time from here
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            t_wall = time.perf_counter()
        t0 = time.perf_counter()
        try:
            imgs, targets = next(it)
        except StopIteration:  # the next epoch
            epoch += 1
            sampler.set_epoch(epoch)
            it = iter(loader)
            imgs, targets = next(it)
        t_data = time.perf_counter()
        imgs = [i.to(dev, non_blocking=True).float().div_(255) for i in imgs]
        targets = [{k: v.to(dev, non_blocking=True) for k, v in t.items()} for t in targets]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            losses = model(imgs, targets)
        loss = sum(losses.values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
            waits.append(t_data - t0)
    wall = time.perf_counter() - t_wall
    mine = {"rank": rank, "times": times, "waits": waits, "wall": wall,
            "cpus": list(pinned.cpus) if pinned is not None else None,
            "threads": torch.get_num_threads()}
    out: list = [None] * world
    dist.all_gather_object(out, mine)
    if rank == 0:
        print("RESULT " + json.dumps({"ranks": out, "batch": args.batch, "world": world}), flush=True)
    del model
    dist.destroy_process_group()


# -- launcher ----------------------------------------------------------------------------------------
def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def summarise(res: dict) -> dict:
    """Per-rank CV and p99/p50 of step time (worst rank reported), samples/s over the timed steps."""
    per_rank = []
    for r in res["ranks"]:
        t = r["times"]
        mean = statistics.fmean(t)
        per_rank.append({"rank": r["rank"], "cv": statistics.pstdev(t) / mean, "p50_ms": 1e3 * _pct(t, 0.5),
                         "p99_ms": 1e3 * _pct(t, 0.99), "p99_p50": _pct(t, 0.99) / _pct(t, 0.5),
                         "data_wait_ms": 1e3 * statistics.fmean(r["waits"]), "threads": r["threads"],
                         "cpus": r["cpus"]})
    steps = len(res["ranks"][0]["times"])
    wall = max(r["wall"] for r in res["ranks"])
    return {"samples_per_s": res["batch"] * res["world"] * steps / wall,
            "cv_worst": max(p["cv"] for p in per_rank), "p99_p50_worst": max(p["p99_p50"] for p in per_rank),
            "p50_ms_mean": statistics.fmean(p["p50_ms"] for p in per_rank),
            "data_wait_ms_mean": statistics.fmean(p["data_wait_ms"] for p in per_rank), "per_rank": per_rank}


def run_arm(arm: str, args: argparse.Namespace, data: Path) -> dict:
    """One torchrun of the benchmark in one arm; its summary."""
    from musubi.contract.env import MUSUBI_CPUS
    from musubi.launch.pin_plan import apply_to_env, plan_pinning

    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(MUSUBI_CPUS, None)
    extra: list[str] = []
    if arm == "pinned":
        plan = plan_pinning(True, "cpu" if args.cpu else "cuda", args.gpus, env)
        env = apply_to_env(plan, env)
        extra = plan.torchrun_args
        note = plan.note
    else:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.gpus))  # Musubi's old default
        note = f"unpinned, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.gpus}", *extra,
           str(Path(__file__).resolve()), "--rank-main", "--arm", arm, "--data", str(data),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
           "--workers", str(args.workers), "--side", str(args.side), "--decodes", str(args.decodes)] + (["--cpu"] if args.cpu else [])
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{arm} arm failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    summary = summarise(json.loads(line.removeprefix("RESULT ")))
    summary.update(arm=arm, note=note, torchrun_args=extra, run_s=round(time.perf_counter() - t0, 1))
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--arm", default="pinned", help=argparse.SUPPRESS)
    ap.add_argument("--cpu", action="store_true", help="tiny CPU mode: gloo ranks, small images")
    ap.add_argument("--gpus", type=int, default=None, help="ranks (default: 4 GPUs, or 2 CPU ranks)")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per arm")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (kernels, autotuning, workers)")
    ap.add_argument("--batch", type=int, default=None, help="images per rank per step (default 8; CPU 2)")
    ap.add_argument("--workers", type=int, default=None,
                    help="loader workers per rank, both arms (default: data.workers auto of the pinned plan)")
    ap.add_argument("--images", type=int, default=None, help="JPEG files to write (default 256; CPU 8)")
    ap.add_argument("--side", type=int, default=None, help="canvas width, 16:9 (default 1333)")
    ap.add_argument("--decodes", type=int, default=4, help="JPEGs decoded per sample (mosaic tiles; default 4)")
    ap.add_argument("--data", default=None, help="folder for the JPEGs (default: a temp folder)")
    ap.add_argument("--rounds", type=int, default=None, help="2: A B B A (each arm twice; default), 1: A B (CPU)")
    ap.add_argument("--json", default=None, help="write every figure here")
    args = ap.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    args.gpus = args.gpus or (2 if args.cpu else 4)
    args.batch = args.batch or (2 if args.cpu else 8)
    args.side = args.side or (160 if args.cpu else 1333)
    n_img = args.images or (8 if args.cpu else 256)
    if args.cpu:
        args.steps = min(args.steps, 5)
        args.warmup = min(args.warmup, 1)
    args.rounds = args.rounds or (1 if args.cpu else 2)
    size = (320, 180) if args.cpu else (1920, 1080)
    data = Path(args.data) if args.data else Path(tempfile.gettempdir()) / "musubi-bench-jpeg"
    t0 = time.perf_counter()
    write_jpegs(data, n_img, *size)
    gen_s = time.perf_counter() - t0
    if args.workers is None:
        from musubi.launch.pin_plan import plan_pinning
        from musubi.worker.pinning import auto_workers, rank_cpus

        plan = plan_pinning(True, "cpu" if args.cpu else "cuda", args.gpus, dict(os.environ))
        cores = min((len(rank_cpus(r, plan.env.get("MUSUBI_CPUS")) or ()) for r in range(args.gpus)), default=0)
        args.workers = auto_workers(cores or max(1, (os.cpu_count() or 1) // args.gpus))
    order = ["unpinned", "pinned", "pinned", "unpinned"] * (args.rounds // 2) if args.rounds > 1 \
        else ["unpinned", "pinned"]
    arms: dict[str, list[dict]] = {"unpinned": [], "pinned": []}
    for arm in order:
        arms[arm].append(run_arm(arm, args, data))
        r = arms[arm][-1]
        print(f"{arm:9s} {r['samples_per_s']:8.1f} samples/s  CV {r['cv_worst']:.3f}  p99/p50 "
              f"{r['p99_p50_worst']:.3f}  p50 {r['p50_ms_mean']:.1f} ms  data wait {r['data_wait_ms_mean']:.1f} ms"
              f"  ({r['run_s']} s)", flush=True)

    def agg(rs: list[dict], key: str, fn=statistics.fmean) -> float:
        return fn(r[key] for r in rs)

    u, p = arms["unpinned"], arms["pinned"]
    result = {
        "device": "cpu" if args.cpu else _device_name(),
        "ranks": args.gpus, "batch_per_rank": args.batch, "workers_per_rank": args.workers, "images": n_img,
        "image_size": f"{size[0]}x{size[1]}", "canvas_width": args.side, "decodes_per_sample": args.decodes, "timed_steps": args.steps,
        "warmup_steps": args.warmup, "cpu_count": os.cpu_count(), "jpeg_gen_s": round(gen_s, 1),
        "pinning": p[0]["note"], "torchrun_args": p[0]["torchrun_args"],
        "unpinned": {"samples_per_s": agg(u, "samples_per_s"), "cv_worst": agg(u, "cv_worst", max),
                     "p99_p50_worst": agg(u, "p99_p50_worst", max)},
        "pinned": {"samples_per_s": agg(p, "samples_per_s"), "cv_worst": agg(p, "cv_worst", max),
                   "p99_p50_worst": agg(p, "p99_p50_worst", max)},
        "runs": arms,
    }
    speed = result["pinned"]["samples_per_s"] / result["unpinned"]["samples_per_s"]
    result["throughput_ratio"] = speed
    result["targets_met"] = {
        "p99_p50_no_worse": result["pinned"]["p99_p50_worst"] <= result["unpinned"]["p99_p50_worst"],
        "cv_no_worse": result["pinned"]["cv_worst"] <= result["unpinned"]["cv_worst"],
        "throughput_1.05x": speed >= 1.05,
    }
    print(f"\n| arm | samples/s | worst-rank CV | worst-rank p99/p50 |\n|---|---|---|---|\n"
          f"| unpinned | {result['unpinned']['samples_per_s']:.1f} | {result['unpinned']['cv_worst']:.3f} | "
          f"{result['unpinned']['p99_p50_worst']:.3f} |\n"
          f"| pinned | {result['pinned']['samples_per_s']:.1f} | {result['pinned']['cv_worst']:.3f} | "
          f"{result['pinned']['p99_p50_worst']:.3f} |\n"
          f"throughput pinned/unpinned {speed:.3f}x; targets: {result['targets_met']}\n"
          f"{result['device']}, {args.gpus} ranks x {args.workers} loader workers, {result['pinning']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


def _device_name() -> str:
    import torch

    return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
