"""Job directories for evaluation tests, written in the runtime's real formats without launching torchrun.

A job is built from its config, trained a few steps in this process, and
checkpointed with the runtime's own `save_checkpoint` (one rank, no process
group), so the evaluation code reads exactly what a real run leaves behind.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from musubi.checkpoint.checkpoint import model_signature, save_checkpoint
from musubi.config.load import job_from_dict
from musubi.contract.world import World
from musubi.store.rundir import write_json
from musubi.tasks.registry import build_task

CLASSIFY = {
    "name": "cls-tiny",
    "task": "classification",
    "model": "resnet18",
    "data": {"synthetic": {"train_size": 16, "val_size": 8, "image_size": 32, "num_classes": 4}, "workers": 0},
}

DETECT = {
    "name": "det-tiny",
    "task": "detection",
    "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
    # Few proposals: fast on a CPU. The shipped score threshold is high, so a barely trained detector reports
    # nothing and the export's parity falls back to comparing the whole graph at threshold 0.
    "model_args": {"rpn_pre_nms_top_n_train": 100, "rpn_post_nms_top_n_train": 50,
                   "rpn_batch_size_per_image": 32, "box_batch_size_per_image": 32, "box_score_thresh": 0.9},
    "data": {"synthetic": {"train_size": 8, "val_size": 4, "image_size": 128, "num_classes": 3,
                           "min_object": 16, "max_object": 40}, "workers": 0},
}

TINY_USER = {
    "name": "mlp-tiny",
    "task": "tests.support.tiny_task:make",
    "model": "mlp",
    "data": {"synthetic": {"train_size": 32, "val_size": 8}, "workers": 0},
}


def make_task_job(run_dir: Path, config: dict[str, Any], steps: int = 2, batch: int = 2,
                  metrics: dict[str, float] | None = None, lr: float = 1e-3) -> Path:
    """RUN/JOB with job.json, a committed checkpoint after `steps` Adam steps, and eval.json if `metrics`.

    `steps=0` (an untrained model) saves a stateless optimizer: DCP would fill an Adam without state with zeros
    (twice the weights: a ResNet-50 detector's checkpoint 476 MB instead of 165 MB), and every load of the
    checkpoint checksums each byte of it."""
    spec = job_from_dict(config)
    task = build_task(spec)
    torch.manual_seed(0)
    model = task.build_model()
    opt = torch.optim.Adam(model.parameters(), lr=lr) if steps else torch.optim.SGD(model.parameters(), lr=lr)
    data = task.train_dataset()
    model.train()
    for step in range(steps):
        samples = [data[(step * batch + i) % len(data)] for i in range(batch)]
        # to_device: the model's own input convention (image files load as uint8; detectors take [0, 1] floats)
        loss, _ = task.loss(model, task.to_device(task.collate(samples), torch.device("cpu")))
        opt.zero_grad()
        loss.backward()
        opt.step()
    job_dir = run_dir / spec.name
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP notes that it saves without a process group: intended here
        save_checkpoint(job_dir / "checkpoints", max(steps, 1), model, opt,
                        {"step": steps, "signature": model_signature(model)}, {}, world, keep_last=1)
    write_json(job_dir / "job.json", {"config": spec.resolved(), "status": "done", "attempts": 1})
    if metrics is not None:
        write_json(job_dir / "eval.json", {"metrics": metrics, "primary_metric": task.primary_metric})
    return job_dir


def tiny_onnx(path: Path, features: int = 4) -> Path:
    """A small ONNX file (Linear + ReLU, symbolic batch) for registry and external-job tests."""
    model = torch.nn.Sequential(torch.nn.Linear(features, 3), torch.nn.ReLU()).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, features),), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return path
