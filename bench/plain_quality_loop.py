"""A plain single-process PyTorch training loop, the comparator of bench/quality.py (no Musubi import).

Written the way torchvision's reference scripts (references/classification/train.py,
references/detection/train.py) are: argparse options, `main(args)`, `train_one_epoch`, `evaluate`; the
model straight from its library (torchvision's builders; Hugging Face transformers' RT-DETR classes built
from a config), nothing downloaded. What it must share with the Musubi run it is compared with, it takes
from its options: model, data files, image side, epochs, batch, optimizer, LR, warm-up and cosine
schedule (the formula written out below), weight decay, gradient clipping, precision, seed.

    python bench/plain_quality_loop.py --task classification --model resnet18 --train DIR --val DIR \
        --image-size 32 --epochs 12 --batch-size 64 --opt sgd --lr 0.05 --output run.json
    python bench/plain_quality_loop.py --task detection --model fasterrcnn_mobilenet_v3_large_fpn \
        --train DIR/images --train-ann DIR/annotations.json --val ... --val-ann ... --output run.json

Data order: `DistributedSampler(num_replicas=1, shuffle=True, seed=SEED, drop_last=True)` with
`set_epoch`, as the references' samplers (one process: a seeded permutation per epoch, the last partial
batch dropped). Writes one JSON file: the loss (mean of the steps since the previous line) and LR every
--log-every steps, the final validation metric (top1; COCO mAP50 and mAP50-95 from pycocotools'
COCOeval, or faster-coco-eval's, whichever is installed, preferring faster-coco-eval), and timings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms
from torchvision.transforms.functional import pil_to_tensor

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def get_args_parser() -> argparse.ArgumentParser:
    """The options (torchvision references' names where they have one)."""
    p = argparse.ArgumentParser(description="Plain PyTorch training loop (quality comparator)", add_help=True)
    p.add_argument("--task", required=True, choices=["classification", "detection"])
    p.add_argument("--model", required=True, help="torchvision builder name, or rtdetr_r18 / dfine_n (transformers)")
    p.add_argument("--model-args", default="{}", help="JSON: keyword arguments of the builder / config fields")
    p.add_argument("--train", required=True, help="image folder (classification) or COCO image directory")
    p.add_argument("--val", required=True)
    p.add_argument("--train-ann", default=None, help="COCO annotation JSON of the train split (detection)")
    p.add_argument("--val-ann", default=None)
    p.add_argument("--image-size", type=int, required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--eval-every", type=int, default=None, help="validate every N epochs, and at the end "
                   "(default: at the end only)")
    p.add_argument("-b", "--batch-size", type=int, required=True)
    p.add_argument("--opt", default="sgd", choices=["sgd", "adamw"])
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (AdamW: beta1)")
    p.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay")
    p.add_argument("--lr-warmup-steps", type=int, default=0, help="linear warm-up, in optimizer steps")
    p.add_argument("--clip-grad-norm", type=float, default=None)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="autocast dtype")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-j", "--workers", type=int, default=2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (the cosine ends there)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--output", required=True, help="JSON file written at the end")
    return p


# -- data -------------------------------------------------------------------------------------------
class CocoBoxes(Dataset):
    """A COCO image directory + annotation file: (uint8 [3, H, W], {"boxes" xyxy, "labels" = category id,
    "image_id"}), crowds skipped."""

    def __init__(self, image_dir: str, ann_file: str) -> None:
        coco = json.loads(Path(ann_file).read_text())
        self.image_dir = Path(image_dir)
        self.images = sorted(coco["images"], key=lambda im: im["id"])
        self.boxes: dict[int, list] = {im["id"]: [] for im in self.images}
        for a in coco["annotations"]:
            if not a.get("iscrowd", 0):
                x, y, w, h = a["bbox"]
                self.boxes[a["image_id"]].append((x, y, x + w, y + h, a["category_id"]))
        self.category_ids = sorted(c["id"] for c in coco["categories"])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        info = self.images[i]
        with Image.open(self.image_dir / info["file_name"]) as im:
            image = pil_to_tensor(im.convert("RGB"))
        rows = torch.tensor(self.boxes[info["id"]], dtype=torch.float32).reshape(-1, 5)
        return image, {"boxes": rows[:, :4], "labels": rows[:, 4].long(), "image_id": info["id"]}


def collate_fn(batch):
    return tuple(zip(*batch, strict=True))


# -- models -----------------------------------------------------------------------------------------
def rtdetr_r18(num_classes: int, extra: dict) -> torch.nn.Module:
    """transformers' RT-DETR with its ResNet-18 backbone, the published r18 sizes, from random weights:
    BatchNorm left trainable (from scratch); encoder channels those of the backbone stages it reads."""
    from transformers import RTDetrConfig, RTDetrForObjectDetection, RTDetrResNetConfig

    backbone = RTDetrResNetConfig(layer_type="basic", hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                                  out_indices=[2, 3, 4])
    config = RTDetrConfig(backbone_config=backbone, num_labels=num_classes, hidden_expansion=0.5,
                          decoder_layers=3, encoder_in_channels=[128, 256, 512],
                          decoder_in_channels=[256, 256, 256], freeze_backbone_batch_norms=False, **extra)
    return RTDetrForObjectDetection(config)


def dfine_n(num_classes: int, extra: dict) -> torch.nn.Module:
    """transformers' D-FINE, nano size (HGNetV2-B0 backbone, two levels at strides 16 and 32, d_model 128) as
    transformers' conversion of the D-FINE-N checkpoint sets it, from random weights, BatchNorm trainable."""
    from transformers import DFineConfig, DFineForObjectDetection, HGNetV2Config

    backbone = HGNetV2Config(stem_channels=[3, 16, 16], stage_in_channels=[16, 64, 256, 512],
                             stage_mid_channels=[16, 32, 64, 128], stage_out_channels=[64, 256, 512, 1024],
                             stage_num_blocks=[1, 1, 2, 1], stage_numb_of_layers=[3, 3, 3, 3],
                             stage_downsample=[False, True, True, True], stage_light_block=[False, False, True, True],
                             stage_kernel_size=[3, 3, 5, 5], use_learnable_affine_block=True,
                             hidden_sizes=[64, 256, 512, 1024], out_indices=[3, 4])
    config = DFineConfig(backbone_config=backbone, num_labels=num_classes, num_feature_levels=2, feat_strides=[16, 32],
                         encode_proj_layers=[1], d_model=128, encoder_hidden_dim=128, encoder_ffn_dim=512,
                         decoder_ffn_dim=512, decoder_n_points=[6, 6], depth_mult=0.5, decoder_layers=3,
                         hidden_expansion=0.34, encoder_in_channels=[512, 1024], decoder_in_channels=[128, 128],
                         freeze_backbone_batch_norms=False, **extra)
    return DFineForObjectDetection(config)


#: The DETR-family models this loop builds from transformers (their own losses and matcher).
DETR_MODELS = {"rtdetr_r18": rtdetr_r18, "dfine_n": dfine_n}


def build_model(args: argparse.Namespace, num_classes: int) -> torch.nn.Module:
    """The model of --model, randomly initialised (the caller seeded torch)."""
    extra = json.loads(args.model_args)
    if args.task == "classification":
        return torchvision.models.get_model(args.model, weights=None, num_classes=num_classes, **extra)
    if args.model in DETR_MODELS:
        return DETR_MODELS[args.model](num_classes, extra)
    # the model resizes to --image-size unless --model-args says otherwise (e.g. a 320 px builder at 320)
    sizes = {"min_size": args.image_size, "max_size": args.image_size}
    return torchvision.models.get_model(args.model, weights=None, weights_backbone=None,
                                        num_classes=num_classes + 1, **{**sizes, **extra})


def detr_labels(targets, side: int) -> list[dict]:
    """transformers' label format: class_labels 0..K-1, boxes cx, cy, w, h normalised by the image side."""
    out = []
    for t in targets:
        x0, y0, x1, y1 = (t["boxes"] / side).unbind(-1)
        out.append({"class_labels": t["labels"] - 1,
                    "boxes": torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], -1)})
    return out


def detection_loss(model, images, targets, args) -> torch.Tensor:
    if args.model in DETR_MODELS:
        return model(pixel_values=torch.stack(images), labels=detr_labels(targets, args.image_size)).loss
    return sum(model(images, targets).values())


# -- schedule ---------------------------------------------------------------------------------------
def lr_lambda(warmup: int, total: int):
    """Linear warm-up over `warmup` steps ((step + 1) / warmup), then a cosine from 1 to 0 at `total`."""

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return f


# -- loops ------------------------------------------------------------------------------------------
def autocast(args):
    if args.precision == "fp32":
        return torch.autocast(args.device_type, enabled=False)
    return torch.autocast(args.device_type, dtype=DTYPES[args.precision])


def train_one_epoch(model, optimizer, lr_scheduler, loader, device, args, state) -> None:
    model.train()
    for batch in loader:
        if args.task == "classification":
            images, target = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
            with autocast(args):
                loss = F.cross_entropy(model(images), target)
        else:
            images = [im.to(device, non_blocking=True).float().div_(255.0) for im in batch[0]]
            targets = [{"boxes": t["boxes"].to(device), "labels": t["labels"].to(device)} for t in batch[1]]
            with autocast(args):
                loss = detection_loss(model, images, targets, args)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        optimizer.step()
        lr_scheduler.step()
        state["step"] += 1
        state["window"].append(loss.detach())
        if state["step"] == state["total"]:
            log_line(state, lr_scheduler)
            return
        if state["step"] % args.log_every == 0:
            log_line(state, lr_scheduler)


def log_line(state: dict, lr_scheduler) -> None:
    """The mean loss of the steps since the last line, and the LR the next step uses."""
    mean = torch.stack(state["window"]).float().mean().item()  # the one host sync of a log step
    state["log"].append({"step": state["step"], "loss": round(mean, 6), "lr": lr_scheduler.get_last_lr()[0]})
    print(f"step {state['step']}/{state['total']} loss {mean:.4f} lr {lr_scheduler.get_last_lr()[0]:.4g}", flush=True)
    state["window"] = []
    if not math.isfinite(mean):
        raise FloatingPointError(f"loss is {mean} at step {state['step']}")


@torch.inference_mode()
def evaluate_classification(model, loader, device, args) -> dict:
    model.eval()
    correct = n = 0
    for images, target in loader:
        with autocast(args):
            logits = model(images.to(device))
        correct += (logits.argmax(1) == target.to(device)).sum().item()
        n += target.numel()
    return {"top1": correct / n}


def coco_eval_classes():
    """(COCO, COCOeval) of faster-coco-eval where installed, else pycocotools', and the backend's name."""
    try:
        from faster_coco_eval import COCO
        from faster_coco_eval import COCOeval_faster as COCOeval

        return COCO, COCOeval, "faster_coco_eval"
    except ImportError:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        return COCO, COCOeval, "pycocotools"


@torch.inference_mode()
def evaluate_detection(model, loader, device, args) -> dict:
    """COCO box mAP of the model's detections on the validation split (COCOeval with its defaults)."""
    model.eval()
    results = []
    if args.model in DETR_MODELS:
        from transformers import RTDetrImageProcessor

        post = RTDetrImageProcessor()
    for images, targets in loader:
        images = [im.to(device).float().div_(255.0) for im in images]
        with autocast(args):
            if args.model in DETR_MODELS:
                out = model(pixel_values=torch.stack(images))
                # top num_queries (score, class) pairs of sigmoid scores over queries x classes, every score kept
                dets = post.post_process_object_detection(out, threshold=0.0,
                                                          target_sizes=[im.shape[-2:] for im in images])
                for d in dets:
                    d["labels"] = d["labels"] + 1  # class 0..K-1 -> category id
            else:
                dets = model(images)
        for d, t in zip(dets, targets, strict=True):
            boxes = d["boxes"].float().cpu()
            boxes[:, 2:] -= boxes[:, :2]  # xyxy -> xywh
            for box, score, label in zip(boxes.tolist(), d["scores"].float().cpu().tolist(),
                                         d["labels"].cpu().tolist(), strict=True):
                results.append({"image_id": t["image_id"], "category_id": int(label), "bbox": box,
                                "score": score})
    COCO, COCOeval, backend = coco_eval_classes()
    if not results:
        return {"map50": 0.0, "map": 0.0, "map_backend": backend, "detections": 0}
    gt = COCO(args.val_ann)
    dt = gt.loadRes(results)
    ev = COCOeval(gt, dt, iouType="bbox")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return {"map50": float(ev.stats[1]), "map": float(ev.stats[0]), "map_backend": backend,
            "detections": len(results)}


def main(args: argparse.Namespace) -> None:
    t_start = time.perf_counter()
    device = torch.device(args.device)
    args.device_type = device.type
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)

    if args.task == "classification":
        tf = transforms.Compose([transforms.Resize(args.image_size), transforms.CenterCrop(args.image_size),
                                 transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        dataset = torchvision.datasets.ImageFolder(args.train, tf)
        dataset_test = torchvision.datasets.ImageFolder(args.val, tf)
        num_classes, collate = len(dataset.classes), None
    else:
        dataset, dataset_test = CocoBoxes(args.train, args.train_ann), CocoBoxes(args.val, args.val_ann)
        num_classes, collate = len(dataset.category_ids), collate_fn
        if dataset.category_ids != list(range(1, num_classes + 1)):
            raise SystemExit("detection: category ids must be 1..K (they are the labels)")
        if args.model in DETR_MODELS and any(im["width"] != args.image_size or im["height"] != args.image_size
                                             for im in dataset.images + dataset_test.images):
            # this loop feeds a DETR its images as they are, boxes normalised by --image-size
            raise SystemExit(f"detection: a DETR here needs every image {args.image_size} px square (--image-size)")

    model = build_model(args, num_classes).to(device)  # initialised from torch.manual_seed(args.seed)

    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        collate_fn=collate, pin_memory=device.type == "cuda", drop_last=True,
                        persistent_workers=args.workers > 0)
    loader_test = DataLoader(dataset_test, batch_size=args.batch_size, shuffle=False, num_workers=args.workers,
                             collate_fn=collate)

    params = [p for p in model.parameters() if p.requires_grad]
    if args.opt == "adamw":
        optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(args.momentum, 0.999),
                                      weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    total = len(loader) * args.epochs
    if args.max_steps:
        total = min(total, args.max_steps)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args.lr_warmup_steps, total))

    state = {"step": 0, "total": total, "window": [], "log": []}
    evaluate = evaluate_classification if args.task == "classification" else evaluate_detection
    every = args.eval_every or args.epochs
    evals, eval_s, train_s = [], 0.0, 0.0
    for epoch in range(args.epochs):
        t_train = time.perf_counter()
        sampler.set_epoch(epoch)
        train_one_epoch(model, optimizer, lr_scheduler, loader, device, args, state)
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_s += time.perf_counter() - t_train
        done = state["step"] >= total
        if (epoch + 1) % every == 0 or epoch + 1 == args.epochs or done:
            t_eval = time.perf_counter()
            metrics = evaluate(model, loader_test, device, args)
            eval_s += time.perf_counter() - t_eval
            evals.append({"step": state["step"], "epoch": epoch + 1, **metrics})
            print(json.dumps(evals[-1]), flush=True)
        if done:
            break
    final = {k: v for k, v in evals[-1].items() if k not in ("step", "epoch")}
    record = {
        "side": "plain", "task": args.task, "model": args.model, "seed": args.seed, "device": str(device),
        "precision": args.precision, "global_batch": args.batch_size, "steps": state["step"],
        "samples_seen": state["step"] * args.batch_size, "lr": args.lr, "log": state["log"], "evals": evals,
        "final": final, "train_s": round(train_s, 2), "eval_s": round(eval_s, 2),
        "wall_s": round(time.perf_counter() - t_start, 2), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "pid": os.getpid(),
    }
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("model", "seed", "steps", "final", "train_s")}), flush=True)


if __name__ == "__main__":
    main(get_args_parser().parse_args())
