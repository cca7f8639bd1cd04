"""What a classifier's data.augment costs per batch on the rank's device, against the same batch unaugmented
and against torchvision's per-image transforms on the host (what a loader worker would spend instead).

An image-folder batch crosses the loader as uint8 [B, 3, S, S] with its sample indices; `train_batch` copies it
to the device, draws each sample's crop/flip/colour on the host from (seed, epoch, index), transforms the whole
batch (one grid_sample, a few element-wise kernels) and normalises it. Timed: the host's time in the call (what
the prefetch thread spends) and the device's (CUDA events), median of --steps batches after --warmup; on CUDA
the call runs under torch.cuda.set_sync_debug_mode("error"), so a host sync inside it fails the bench.

    python bench/classify_augment.py [--batch 256] [--size 224] [--steps 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torchvision.transforms import v2

from musubi.config.load import job_from_dict
from musubi.tasks.classification import ClassificationTask


def task(augment: dict[str, Any] | None) -> ClassificationTask:
    """A classifier job on an image folder (its batches: uint8 and indices under augment), seed 0."""
    data: dict[str, Any] = {"train": {"path": "unused"}, "image_size": 224}
    if augment is not None:
        data["augment"] = augment
    spec = job_from_dict({"name": "bench", "task": "classification", "model": "resnet50", "data": data},
                         source="bench")
    return ClassificationTask(spec)


def timed(fn: Any, steps: int, warmup: int, device: torch.device) -> dict[str, float]:
    """Median host ms in `fn()` and device ms between events around it."""
    host, dev = [], []
    for i in range(warmup + steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if device.type == "cuda":
            end.record()
            end.synchronize()
            if i >= warmup:
                dev.append(start.elapsed_time(end))
        if i >= warmup:
            host.append((t1 - t0) * 1e3)
    out = {"host_ms": round(statistics.median(host), 3)}
    if dev:
        out["device_ms"] = round(statistics.median(dev), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--host-images", type=int, default=64, help="Images timed through the host transforms.")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 1000, (args.batch,), generator=g)
    index = torch.arange(args.batch)
    if device.type == "cuda":
        images, labels, index = images.pin_memory(), labels.pin_memory(), index.pin_memory()
    batch = [images, labels, index]
    plain, aug = task(None), task({})
    epoch = [0]

    def augmented() -> None:
        epoch[0] += 1  # new draws every batch, as every epoch has
        aug.train_batch(batch, device, epoch[0])

    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")  # a host sync in either call raises
    results = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "batch": args.batch, "size": args.size, "recipe": "augment: {} "
               "(crop_scale [0.08, 1], crop_ratio [3/4, 4/3], hflip 0.5, brightness/contrast/saturation 0.4)",
               "unaugmented": timed(lambda: plain.to_device(batch, device), args.steps, args.warmup, device),
               "augmented": timed(augmented, args.steps, args.warmup, device)}
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("default")
    # The host alternative: torchvision's v2 transforms on one uint8 image at a time, in a loader worker.
    host_tf = v2.Compose([v2.RandomResizedCrop(args.size, antialias=True), v2.RandomHorizontalFlip(),
                          v2.ColorJitter(0.4, 0.4, 0.4), v2.ToDtype(torch.float32, scale=True),
                          v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    one = images[0].clone()
    per_image = timed(lambda: host_tf(one), args.host_images, 3, torch.device("cpu"))["host_ms"]
    results["host_transforms_per_image_ms"] = per_image
    results["host_transforms_per_batch_ms"] = round(per_image * args.batch, 1)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
