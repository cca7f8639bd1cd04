"""Feeder bench: FCOS (ResNet-50 FPN) DDP training fed from real JPEG files vs the same job fed from the device.

    python bench/data.py [--gpus 4] [--steps 20] [--warmup 5] [--work DIR] [--json OUT.json]
    python bench/data.py --cpu            # tiny CPU mode (gloo, 2 ranks): proves the plumbing only

Data sets are written first, on the local disk of this machine, with every core
(musubi.data.synthetic_files: small objects on big frames, real JPEG files):
  frames1080  1920x1080 frames, fed whole (the model resizes to 800..1333 on the GPU);
  tiles640    4000x3000 frames cut offline into 640x640 tiles (musubi.data.sliced.slice_coco);
  inline640   (with --sets) the same 4000x3000 frames cut inline by the feeder (data.slice).
Each set is trained (batch 16 per GPU, bf16, SGD) under these feeders, in one process group:
  device      reference: 4 batches of the same decoded samples kept on the GPU and cycled;
  musubi      the default feeder, as `musubi train` builds it (worker.feed.TrainFeed, data.gpu_decode:
              auto, data.workers: auto, data.jpeg_decoder: auto): on CUDA, workers read file bytes, the GPU
              decodes the batch (its hardware JPEG engines through nvImageCodec where installed, else
              nvJPEG on the SMs; inline tiles cut there from each frame decoded once), the next batch is
              prepared on a side stream by a background thread, across epoch boundaries too;
  musubi-cuda the same with data.jpeg_decoder: cuda (torchvision's nvJPEG on the SMs);
  musubi-hw   the same with data.jpeg_decoder: hardware (nvImageCodec on the engines; where they cannot be
              used the row says why and decodes with nvJPEG: its "decoder" field names what ran);
  musubi-workers  the same feeder with data.gpu_decode: false (workers decode, uint8 to the GPU);
  default-w4  DataLoader(num_workers=4), float images, no pinning (torch defaults);
  default-w0  DataLoader(num_workers=0), float images, no pinning (torch defaults).
Measurements run feeder by feeder, each on every set, in --feeders' order. --budget-s bounds the time
spent measuring: a measurement is skipped when the time spent plus the longest measurement so far would
pass it, except for the feeders in --must (default device,musubi), which always run. --json is rewritten
after every measurement ("complete": false until the end), so a call cut short keeps what it measured.
Each row carries its phases (build, warm-up, timed, close, in s) and, for musubi feeders, the feeder's
stage times a batch over the timed steps (read, sync, decode, convert, augment, h2d, prepare, wait: see
musubi.worker.feed.loaders.TrainFeed.times) and on CUDA the synchronising calls one train_batch made
on a side stream (torch.cuda.set_sync_debug_mode; target 0).
Figures per feeder: images/s over all GPUs, ratio to the device reference (target >= 0.95),
and data wait = host time blocked until the loader hands over the next batch, as % of step
time (an upper bound of GPU starvation: the GPU may still be busy with queued work meanwhile;
target <= 2 %); the copy to the device counts as step time, so it shows in the ratio. Files sit in the page cache after being written (a warm data set, as from a
second epoch); the decode and copy work is what is measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from musubi.config.job import JobSpec  # noqa: E402
from musubi.contract.world import World  # noqa: E402
from musubi.data.coco import CocoDetection  # noqa: E402
from musubi.data.sliced import slice_coco  # noqa: E402
from musubi.data.slicing import SliceParams  # noqa: E402
from musubi.data.synthetic_files import SyntheticFiles, write_synthetic_coco  # noqa: E402
from musubi.tasks.detection import DetectionTask  # noqa: E402
from musubi.worker.feed.loaders import TrainFeed  # noqa: E402

#: The table's order. They run in --feeders' order (feeder by feeder, each on every set); should --budget-s
#: cut the run short, the last ones go (the default order keeps torch's loader before musubi-workers).
FEEDERS = ("device", "musubi", "musubi-cuda", "musubi-hw", "musubi-workers", "default-w4", "default-w0")
#: data.jpeg_decoder of each musubi feeder that sets one.
JPEG_DECODER = {"musubi-cuda": "cuda", "musubi-hw": "hardware"}
SETS = ("frames1080", "tiles640", "inline640")
CLASSES = 4


def make_sets(work: Path, cpu: bool, frames: int, big_frames: int, names: list[str]) -> dict[str, dict[str, Any]]:
    """Write the JPEG sets (and slice the big frames); returns name -> {path, annotations, seconds, ...}."""
    out: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    if cpu:
        p = SyntheticFiles(frames, 320, 180, CLASSES, 6, 6, 20, seed=1)
    else:
        p = SyntheticFiles(frames, 1920, 1080, CLASSES, 12, 12, 64, seed=1)
    ann = write_synthetic_coco(work / "frames1080", p)
    out["frames1080"] = {"path": str(ann.parent / "images"), "annotations": str(ann), "frames": frames,
                         "size": f"{p.width}x{p.height}", "write_s": round(time.perf_counter() - t0, 1)}
    t0 = time.perf_counter()
    big = SyntheticFiles(big_frames, 800, 600, CLASSES, 20, 6, 20, seed=2) if cpu else \
        SyntheticFiles(big_frames, 4000, 3000, CLASSES, 60, 12, 48, seed=2)
    big_ann = write_synthetic_coco(work / "frames4k", big)
    tile = 128 if cpu else 640
    report = slice_coco(big_ann, big_ann.parent / "images", work / "tiles640",
                        SliceParams(tile=tile, overlap=0.2, min_visibility=0.5, empty_ratio=0.1))
    out["tiles640"] = {"path": str(work / "tiles640" / "images"), "annotations": report.annotations,
                       "frames": big_frames, "size": f"{big.width}x{big.height} -> {tile}x{tile} tiles",
                       "tiles": report.tiles, "worst_case_tiles": report.worst_case,
                       "write_s": round(time.perf_counter() - t0, 1)}
    out["inline640"] = {"path": str(big_ann.parent / "images"), "annotations": str(big_ann), "frames": big_frames,
                        "size": f"{big.width}x{big.height} -> {tile}x{tile} tiles cut inline", "tile": tile,
                        "tiles": report.tiles, "write_s": 0.0}
    return {k: v for k, v in out.items() if k in names}


def feeder_task(info: dict[str, Any], feeder: str, batch: int, device: torch.device) -> DetectionTask:
    """The detection task `musubi train` would build for this set (defaults but workers: auto).

    On CPU (--cpu) the musubi feeder decodes file bytes on the rank (gpu_decode: true), so the rehearsal
    runs the path the GPUs take (auto would decode in the workers there)."""
    decode: bool | str = "auto" if device.type == "cuda" else True
    data: dict[str, Any] = {"train": {"path": info["path"], "annotations": info["annotations"]}, "workers": "auto",
                            "gpu_decode": False if feeder == "musubi-workers" else decode}
    if feeder in JPEG_DECODER:
        data["jpeg_decoder"] = JPEG_DECODER[feeder]
    if "tile" in info:
        data["slice"] = {"tile": info["tile"], "overlap": 0.2, "min_visibility": 0.5, "empty_ratio": 0.1,
                         "sliced_eval": False}
    # Epochs enough for any --steps: the feed reads ahead across epoch boundaries up to the last one.
    spec = JobSpec(name="bench", task="detection", model="fcos_resnet50_fpn", data=data,
                   train={"batch": batch, "seed": 1, "epochs": 10_000})
    task = DetectionTask(spec)
    task.use_device(device)
    return task


def prepare_syncs(task: DetectionTask, feed: TrainFeed, batch: int, device: torch.device) -> int:
    """Synchronising CUDA calls in one train_batch on a side stream, as the prefetch thread runs it (target 0).

    Counted by torch.cuda.set_sync_debug_mode, which sees PyTorch's own waits (a small torch.tensor(...,
    device=), a boolean index, .item()); nvJPEG's wait for its own stream inside torchvision is not one.
    """
    ds = feed.loader.dataset
    host = task.collate([ds[i] for i in range(batch)])  # read here, not through the loader's workers
    side = torch.cuda.Stream(device)
    with warnings.catch_warnings(record=True) as caught, torch.cuda.stream(side):
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            task.train_batch(host, device, 0)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    side.synchronize()
    return sum("synchroniz" in str(w.message) for w in caught)


def report(args: argparse.Namespace, world: int, device: str, sets: dict[str, dict[str, Any]],
           rows: list[dict[str, Any]], complete: bool) -> dict[str, Any]:
    """The JSON document: the run's settings, the sets, the rows so far (with ratios), whether it finished."""
    return {"device": device, "world": world, "cores": os.cpu_count(), "batch_per_rank": args.batch,
            "steps": args.steps, "warmup": args.warmup, "torch": torch.__version__, "sets": sets,
            "rows": summarise([dict(r) for r in rows]), "targets": {"vs_device_min": 0.95, "data_wait_pct_max": 2.0},
            "command": " ".join(sys.argv), "complete": complete,
            "wall_s": round(time.perf_counter() - args.t_start, 1) if complete else None,
            "elapsed_s": round(time.time() - args.t_wall, 1)}


def musubi_batches(feed: TrainFeed) -> Any:
    """The feed's device batches, epoch after epoch."""
    epoch = 0
    while True:
        yield from feed.epoch(epoch, 0)
        epoch += 1


def collate(samples: list[Any]) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Detection batches: lists, not stacked (images differ in size in general)."""
    return [s[0] for s in samples], [s[1] for s in samples]


def _to_device(batch: Any, device: torch.device, feeder: str) -> tuple[list[torch.Tensor], list[dict]]:
    images, targets = batch
    blocking = feeder.startswith("default")
    images = [im.to(device, non_blocking=not blocking) for im in images]
    images = [im.float().div_(255.0) if im.dtype == torch.uint8 else im for im in images]
    targets = [{k: v.to(device, non_blocking=not blocking) for k, v in t.items()} for t in targets]
    return images, targets


def _on_device(batch: Any, device: torch.device, feeder: str) -> Any:
    """The device reference's batches are already there."""
    return batch


def _loader(ds_info: dict[str, Any], feeder: str, batch: int, rank: int, world: int, epoch_seed: int) -> Any:
    """torch's default DataLoader (float images, no pinning) over the set's files."""
    from torch.utils.data import DataLoader, DistributedSampler

    ds = CocoDetection(ds_info["path"], ds_info["annotations"], check_files=False)
    sampler = DistributedSampler(ds, world, rank, shuffle=True, seed=epoch_seed, drop_last=True)
    return DataLoader(ds, batch_size=batch, sampler=sampler, collate_fn=collate, drop_last=True,
                      num_workers=0 if feeder == "default-w0" else 4)


def _batches(loader: Any) -> Any:
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def run_rank(rank: int, world: int, args: argparse.Namespace, sets: dict[str, dict[str, Any]], result: str) -> None:
    """One rank: for each data set and feeder, warm up, then time `steps` DDP steps."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torchvision.models.detection import fcos_resnet50_fpn

    cuda = not args.cpu
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    # Loader workers forked, as under torchrun (a spawned rank would otherwise spawn them and pickle the data
    # set, whose shared tile cache cannot cross a pickle).
    mp.set_start_method("fork", force=True)
    os.environ["LOCAL_WORLD_SIZE"] = str(world)  # data.workers: auto shares the cores among the ranks, as torchrun
    me = World(rank=rank, local_rank=rank, size=world, device=device, backend="nccl" if cuda else "gloo")
    torch.manual_seed(0)
    size = {"min_size": 64, "max_size": 96} if args.cpu else {"min_size": 800, "max_size": 1333}
    model = fcos_resnet50_fpn(weights=None, weights_backbone=None, num_classes=CLASSES + 1, **size).to(device)
    ddp = DDP(model, device_ids=[rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = []

    def step(images: list[torch.Tensor], targets: list[dict], net: Any = ddp) -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype, enabled=cuda):
            losses = net(images, targets)
        loss = sum(losses.values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    t_begin = time.perf_counter()
    longest = 0.0  # s, the longest measurement so far: what the next one may take
    name = torch.cuda.get_device_name(device) if cuda else "cpu (gloo)"
    for feeder in args.feeders:
        for set_name, info in sets.items():
            # Every rank agrees whether time is left (the slowest rank's clock decides).
            spent = torch.tensor([time.perf_counter() - t_begin], dtype=torch.float64, device=device)
            dist.all_reduce(spent, op=dist.ReduceOp.MAX)
            if float(spent) + longest > args.budget_s and feeder not in args.must:
                if rank == 0:
                    print(f"  {set_name} {feeder}: skipped ({float(spent):.0f} s spent + {longest:.0f} s for one "
                          f"measurement > --budget-s {args.budget_s:.0f})", flush=True)
                continue
            loader: Any = None
            task: DetectionTask | None = None
            if feeder.startswith("default") and "tile" in info:
                if rank == 0:
                    print(f"  {set_name} {feeder}: skipped (torch's loader has no inline slicing)", flush=True)
                continue
            t_build = time.perf_counter()
            syncs = None
            if feeder == "device":
                # Four batches decoded by the musubi feeder without loader workers (none to start and stop).
                src = TrainFeed(feeder_task(info, "musubi", args.batch, device), me, args.batch, 0, 0, True)
                it = musubi_batches(src)
                pool = [next(it) for _ in range(4)]
                it.close()
                del it, src
                feed = (pool[i % 4] for i in range(10**9))
                to_device = _on_device
            elif feeder.startswith("musubi"):
                task = feeder_task(info, feeder, args.batch, device)
                loader = TrainFeed(task, me, args.batch, 1, "auto", True)
                if cuda:
                    syncs = prepare_syncs(task, loader, args.batch, device)
                if rank == 0:
                    print(f"  {set_name} {feeder}: {loader.plan.record()}", flush=True)
                feed = musubi_batches(loader)
                to_device = _on_device
            else:
                loader = _loader(info, feeder, args.batch, rank, world, 1)
                feed = _batches(loader)
                to_device = _to_device
            t_warm = time.perf_counter()
            for _ in range(args.warmup):
                step(*to_device(next(feed), device, feeder))
            sync()
            dist.barrier()
            if isinstance(loader, TrainFeed):  # stage times of the timed steps only
                loader.prefetcher.clock.reset()
                assert task is not None
                task.feed_clock.reset()
            wait = 0.0
            t0 = time.perf_counter()
            for _ in range(args.steps):
                # Data wait: blocked until the loader hands over a host batch. The copy to the device
                # belongs to the step (a blocking copy from pageable memory also waits for queued kernels).
                a = time.perf_counter()
                host = next(feed)
                wait += time.perf_counter() - a
                last = step(*to_device(host, device, feeder))
            float(last)  # one sync at the end: the host is free to run ahead as in training
            sync()
            elapsed = time.perf_counter() - t0
            times = loader.times() if isinstance(loader, TrainFeed) else None
            path = loader.plan.record() if isinstance(loader, TrainFeed) else None
            decoded = task.feed_counts().get("decoded") if task is not None else None
            # The slowest rank sets the pace of a synchronous job; its wait is what starved it.
            stats = torch.tensor([elapsed, wait], dtype=torch.float64, device=device)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            elapsed, wait = stats.tolist()
            t_close = time.perf_counter()
            # Shut this feeder's workers down before the next one is timed (they would steal its cores).
            if hasattr(feed, "close"):
                feed.close()
            if isinstance(loader, TrainFeed):
                loader.close()  # as a training run ends them (Trainer.close), not left to the collector
            del feed, loader, task
            gc.collect()
            done = time.perf_counter()
            longest = max(longest, done - t_build)
            rows.append({"set": set_name, "feeder": feeder, "steps": args.steps, "step_ms": 1000 * elapsed / args.steps,
                         "images_per_s": args.steps * args.batch * world / elapsed,
                         "data_wait_pct": 100 * wait / elapsed,
                         "path": path, "decoded": decoded,
                         "times_rank0": times, "prepare_syncs": syncs,
                         "phases_s": {"build": round(t_warm - t_build, 1), "warmup": round(t0 - t_warm, 1),
                                      "timed": round(elapsed, 1), "close": round(done - t_close, 1)}})
            if rank == 0:  # as it goes: a run cut short still shows what it measured
                r = rows[-1]
                print(f"  {set_name} {feeder}: {r['step_ms']:.1f} ms/step, {r['images_per_s']:.1f} img/s, "
                      f"data wait {r['data_wait_pct']:.2f} %; phases {r['phases_s']}", flush=True)
                if decoded:
                    print(f"    decoded (rank 0): {decoded}", flush=True)
                if times:
                    print("    a batch (rank 0): " + ", ".join(
                        f"{k} {v['host_ms']:.1f} ms" + (f" (device {v['device_ms']:.1f})" if "device_ms" in v else "")
                        for k, v in times.items()) + (f"; syncs in train_batch: {syncs}" if syncs is not None else ""),
                        flush=True)
                Path(result).write_text(json.dumps(rows))
                args.json.write_text(json.dumps(report(args, world, name, sets, rows, complete=False), indent=1))
    dist.barrier()
    del ddp
    dist.destroy_process_group()


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows by set (feeders in FEEDERS order), with the ratio to the on-device reference of the same set."""
    rows = sorted(rows, key=lambda r: (r["set"], FEEDERS.index(r["feeder"])))
    ref = {r["set"]: r["images_per_s"] for r in rows if r["feeder"] == "device"}
    for r in rows:
        r["vs_device"] = r["images_per_s"] / ref[r["set"]] if r["set"] in ref else None
    return rows


def main() -> None:
    """Write the sets, run every feeder in one process group, print the table and write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=None, help="GPUs (default: all visible).")
    ap.add_argument("--cpu", action="store_true", help="Tiny CPU mode (gloo, 2 ranks, small frames).")
    ap.add_argument("--steps", type=int, default=None, help="Timed steps per feeder (default 20; CPU 2).")
    ap.add_argument("--warmup", type=int, default=None, help="Untimed steps first (default 5; CPU 1).")
    ap.add_argument("--batch", type=int, default=None, help="Images per GPU (default 16; CPU 2).")
    ap.add_argument("--frames", type=int, default=None, help="1920x1080 frames written (default 2048; CPU 16).")
    ap.add_argument("--big-frames", type=int, default=None, help="4000x3000 frames written (default 64; CPU 1).")
    ap.add_argument("--feeders", default="device,musubi,default-w4,musubi-workers",
                    help="Comma-separated subset of " + ",".join(FEEDERS))
    ap.add_argument("--sets", default="frames1080,tiles640", help="Comma-separated subset of " + ",".join(SETS))
    ap.add_argument("--budget-s", type=float, default=None,
                    help="Seconds of measuring: a measurement that would end after it (spent + the longest so far) "
                    "is skipped, unless its feeder is in --must (default 180 on GPUs, none on CPU).")
    ap.add_argument("--must", default="device,musubi",
                    help="Feeders measured whatever --budget-s says (comma-separated; '' for none).")
    ap.add_argument("--work", type=Path, default=None, help="Folder for the JPEG sets (default: a temp dir).")
    ap.add_argument("--json", type=Path, default=Path("bench-data.json"), help="Where to write the results.")
    args = ap.parse_args()
    args.feeders = [f for f in args.feeders.split(",") if f]
    unknown = set(args.feeders) - set(FEEDERS)
    if unknown:
        ap.error(f"unknown feeders {sorted(unknown)}; known: {', '.join(FEEDERS)}")
    args.must = [f for f in args.must.split(",") if f]
    if set(args.must) - set(FEEDERS):
        ap.error(f"unknown feeders in --must {sorted(set(args.must) - set(FEEDERS))}; known: {', '.join(FEEDERS)}")
    args.sets = [x for x in args.sets.split(",") if x]
    if set(args.sets) - set(SETS):
        ap.error(f"unknown sets {sorted(set(args.sets) - set(SETS))}; known: {', '.join(SETS)}")
    # GPU: 2048 frames and ~2500 tiles give 32+ steps an epoch at 4 GPUs (64 at 2): 100 timed steps cross an
    # epoch boundary, as the figures ask (the feed prepares the next epoch while the last steps run).
    d = (2, 1, 2, 16, 1) if args.cpu else (20, 5, 16, 2048, 64)
    args.steps, args.warmup, args.batch = args.steps or d[0], args.warmup or d[1], args.batch or d[2]
    args.frames, args.big_frames = args.frames or d[3], args.big_frames or d[4]
    if args.budget_s is None:
        args.budget_s = float("inf") if args.cpu else 180.0
    world = 2 if args.cpu else (args.gpus or torch.cuda.device_count())
    if world < 1:
        ap.error("no GPU visible; use --cpu for the plumbing check")
    args.t_start, args.t_wall = time.perf_counter(), time.time()  # the ranks report elapsed time from this
    with tempfile.TemporaryDirectory(prefix="musubi-bench-data-", dir=args.work) as tmp:
        sets = make_sets(Path(tmp), args.cpu, args.frames, args.big_frames, args.sets)
        for name, info in sets.items():
            print(f"{name}: {info['size']}, {info.get('tiles', info['frames'])} samples, written in "
                  f"{info['write_s']} s", flush=True)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29000 + os.getpid() % 1000))
        result = Path(tmp) / "rows.json"
        mp.start_processes(run_rank, args=(world, args, sets, str(result)), nprocs=world, join=True,
                           start_method="spawn")
        rows = summarise(json.loads(result.read_text())) if result.exists() else []
    device = torch.cuda.get_device_name(0) if not args.cpu else "cpu (gloo)"
    print(f"\nFCOS ResNet-50 FPN, batch {args.batch}/rank x {world} ranks, {device}, cores {os.cpu_count()}, "
          f"{args.steps} timed steps after {args.warmup}")
    print(f"{'set':<11} {'feeder':<14} {'step ms':>8} {'img/s':>8} {'vs device':>9} {'data wait':>9}  JPEG decoder")
    for r in rows:
        vs = f"{r['vs_device']:.3f}" if r["vs_device"] is not None else "-"
        print(f"{r['set']:<11} {r['feeder']:<14} {r['step_ms']:8.1f} {r['images_per_s']:8.1f} {vs:>9} "
              f"{r['data_wait_pct']:8.2f}%  {(r.get('decoded') or {}).get('decoder', '-')}")
    out = report(args, world, device, sets, rows, complete=True)
    args.json.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json} ({out['wall_s']} s)")


if __name__ == "__main__":
    main()
