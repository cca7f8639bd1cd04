"""`musubi export --format pt`: a job's trained weights as a plain state_dict file.

JOB/export/model.pt holds only tensors (torch.save of the model's state_dict),
so `torch.load(path, weights_only=True)` reads it and `load_state_dict` puts it
into the same torchvision/timm model built fresh (the recipe is in weights.json
beside it). It is also what a job's `weights:` field accepts, to start another
job from these weights.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import torch

from musubi.config.errors import ConfigError
from musubi.evaluate.model_io import load_job_model
from musubi.evaluate.onnx_export import EXPORT_DIR
from musubi.store.registry import file_sha256
from musubi.store.rundir import write_json
from musubi.tasks.registry import build_task
from musubi.tasks.weights import weights_mismatch

PT_FILE, PT_JSON = "model.pt", "weights.json"


def _recipe(task: Any) -> dict[str, Any]:
    """How to build the model the weights fit, where the task says (classification: torchvision/timm)."""
    spec = task.spec
    out: dict[str, Any] = {"task": spec.task, "model": spec.model}
    if spec.task == "classification":
        args = dict(task.model_args())
        out.update(num_classes=task.num_classes(), model_args=args, image_size=task.image_size())
        if spec.data.synthetic is None:
            out["classes"] = task.classes()  # output index i is class folder classes[i]
            out["preprocess"] = "resize + centre crop to image_size, ImageNet mean/std normalisation"
        extra = "".join(f", {k}={v!r}" for k, v in args.items())
        if spec.model.startswith("timm/"):
            out["build"] = (f"timm.create_model({spec.model.removeprefix('timm/')!r}, pretrained=False, "
                            f"num_classes={task.num_classes()}{extra})")
        else:
            out["build"] = (f"torchvision.models.get_model({spec.model!r}, weights=None, "
                            f"num_classes={task.num_classes()}{extra})")
    return out


def export_weights(job_dir: Path) -> dict[str, Any]:
    """Write JOB/export/model.pt (the newest committed checkpoint's model state_dict) and weights.json."""
    job = load_job_model(Path(job_dir))
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in job.model.state_dict().items()}
    out_dir = job.job_dir / EXPORT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{PT_FILE}.{os.getpid()}.tmp"
    try:
        torch.save(state, tmp)
        # The promise, checked before the file takes its name: plain tensors, strict fit into a fresh model.
        back = torch.load(tmp, map_location="cpu", weights_only=True)
        problem = weights_mismatch(back, build_task(job.spec).build_model())
        if problem is not None:
            raise ConfigError(f"export: {job.job_dir.name}'s weights do not fit a freshly built {job.spec.model} "
                              f"({problem}); report this with JOB/job.json")
        os.replace(tmp, out_dir / PT_FILE)
    finally:
        tmp.unlink(missing_ok=True)
    final = out_dir / PT_FILE
    record = {
        "format": "pt",
        "file": PT_FILE,
        "sha256": file_sha256(final),
        "bytes": final.stat().st_size,
        "tensors": len(state),
        "job": job.spec.name,
        **_recipe(job.task),
        "load": f"model.load_state_dict(torch.load({PT_FILE!r}, weights_only=True))",
        "checkpoint": str(job.checkpoint),
        "step": job.step,
        "torch": torch.__version__,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(),
    }
    write_json(out_dir / PT_JSON, record)
    return record
