"""`musubi export --format pt`: a job's trained weights as a plain state_dict file.

JOB/export/model.pt holds only tensors (torch.save of the model's state_dict),
so `torch.load(path, weights_only=True)` reads it and `load_state_dict` puts it
into the same torchvision/timm model built fresh: weights.json beside it holds the
builder with every argument (`builder`, rebuilt by musubi.tasks.rebuild.rebuild_model,
or by hand from `build`), the class names and the inference recipe. It is also what a job's `weights:` field accepts, to start another
job from these weights.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import torch

from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.evaluate.model_io import load_job_model
from musubi.evaluate.recipe import inference_recipe
from musubi.evaluate.registry import file_sha256
from musubi.store.rundir import write_json
from musubi.tasks.rebuild import model_recipe, rebuild_model
from musubi.tasks.weights import weights_mismatch

PT_FILE, PT_JSON = "model.pt", "weights.json"


def _recipe(job: Any) -> dict[str, Any]:
    """Everything needed to rebuild the model and reproduce its outputs: the builder and all its arguments
    (musubi.tasks.rebuild), class names, input size and the inference recipe (preprocessing, slicing)."""
    spec, task = job.spec, job.task
    builder = model_recipe(task)
    recipe = inference_recipe(job)
    out: dict[str, Any] = {"task": spec.task, "model": spec.model, "num_classes": builder.get("num_classes"),
                           "classes": recipe["classes"], "build": builder["build"], "builder": builder,
                           "rebuild": "musubi.tasks.rebuild.rebuild_model(weights_json['builder'])",
                           "recipe": recipe}
    if spec.task == "classification":
        out.update(model_args=dict(task.model_args()), image_size=task.image_size())
        if spec.data.synthetic is None:
            out["preprocess"] = "resize + centre crop to image_size, ImageNet mean/std normalisation"
    elif spec.task == "detection":
        out["image_size"] = task.image_size  # the model's input side (min_size = max_size for resizing detectors)
        out["category_ids"] = recipe.get("category_ids")
    return out


def export_weights(job_dir: Path, checkpoint: str | int | None = None) -> dict[str, Any]:
    """Write JOB/export/model.pt (a committed checkpoint's model state_dict: best, last or a step; default the
    newest) and weights.json."""
    job = load_job_model(Path(job_dir), checkpoint)
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in job.model.state_dict().items()}
    out_dir = job.job_dir / RUN_FILES.export
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{PT_FILE}.{os.getpid()}.tmp"
    try:
        torch.save(state, tmp)
        # The promise, checked before the file takes its name: plain tensors, strict fit into a fresh model.
        back = torch.load(tmp, map_location="cpu", weights_only=True)
        problem = weights_mismatch(back, rebuild_model(model_recipe(job.task)))
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
        **_recipe(job),
        "load": f"model.load_state_dict(torch.load({PT_FILE!r}, weights_only=True))",
        "checkpoint": str(job.checkpoint),
        "step": job.step,
        "torch": torch.__version__,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(),
    }
    write_json(out_dir / PT_JSON, record)
    return record
