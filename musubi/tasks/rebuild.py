"""A trained model's build recipe: the builder and every argument it was called with, as JSON.

`model_recipe(task)` is written into an export's weights.json and export.json;
`rebuild_model(recipe)` builds the same module again without the job's data or
config, so `torch.load(model.pt, weights_only=True)` fits it and gives the boxes
the trained model gives. A detector rebuilt from its name alone is not that
model: torchvision's Faster R-CNN defaults to min_size 800, 91 classes and a
score threshold of 0.05, where the job may have trained at 224 px with 3
classes and its own thresholds (issue 42: 8 boxes instead of 71).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from musubi.contract.errors import ConfigError
from musubi.tasks.base import Task

#: The recipe format; a reader refuses another.
RECIPE_FORMAT = "musubi-build/1"


def model_recipe(task: Task) -> dict[str, Any]:
    """How the task built its model: {"format", "kind", "model", "num_classes", "kwargs", "stem", "build"}."""
    spec = task.spec
    out: dict[str, Any] = {"format": RECIPE_FORMAT, "model": spec.model}
    stem = spec.data.channels == 1 and spec.data.one_channel == "stem"
    out["stem"] = "1-channel" if stem else None
    if spec.task == "detection":
        from musubi.tasks import detr, efficientdet

        classes = int(task.num_classes)  # type: ignore[attr-defined]
        args = dict(spec.model_args)
        side = task.image_size  # type: ignore[attr-defined]
        if detr.is_detr_model(spec.model):
            out.update(kind="musubi-detr", num_classes=classes, kwargs={"model_args": args, "image_size": side},
                       build=f"musubi.tasks.detr.build_detector({spec.model!r}, {classes}, model_args, image_size)")
        elif efficientdet.is_effdet_model(spec.model):
            normalize = spec.data.channels != 1
            out.update(kind="musubi-effdet", num_classes=classes,
                       kwargs={"model_args": args, "image_size": side, "normalize": normalize},
                       build=f"musubi.tasks.efficientdet.build_detector({spec.model!r}, {classes}, model_args, "
                             f"image_size, normalize={normalize})")
        else:
            kwargs = {"weights": None, "weights_backbone": None, "num_classes": classes + 1,
                      **task.model_kwargs()}  # type: ignore[attr-defined]
            shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            out.update(kind="torchvision-detection", num_classes=classes, kwargs=kwargs,
                       build=f"torchvision.models.detection.{spec.model}({shown})")
    elif spec.task == "classification":
        classes = int(task.num_classes())  # type: ignore[attr-defined]
        args = dict(task.model_args())  # type: ignore[attr-defined]
        extra = "".join(f", {k}={v!r}" for k, v in args.items())
        build = (f"timm.create_model({spec.model.removeprefix('timm/')!r}, pretrained=False, "
                 f"num_classes={classes}{extra})" if spec.model.startswith("timm/") else
                 f"torchvision.models.get_model({spec.model!r}, weights=None, num_classes={classes}{extra})")
        out.update(kind="classification", num_classes=classes, kwargs={"model_args": args}, build=build)
    else:
        # LM and user tasks: their own build_model, from the job's resolved config (needs musubi and the task's
        # module; data only where the task reads it to size the model).
        out.update(kind="job", num_classes=None, kwargs={"config": spec.resolved()},
                   build=f"musubi.tasks.registry.build_task(job config).build_model()  # task {spec.task!r}")
    if stem:
        out["build"] += "; then musubi.tasks.stem.adapt_stem(model) (first convolution takes 1 channel)"
    return out


def rebuild_model(recipe: dict[str, Any]) -> nn.Module:
    """A fresh module built by `recipe` (model_recipe's), on the CPU, in eval mode; ConfigError if unreadable."""
    if not isinstance(recipe, dict) or recipe.get("format") != RECIPE_FORMAT:
        raise ConfigError(f"build recipe: format {recipe.get('format') if isinstance(recipe, dict) else None!r}, "
                          f"not {RECIPE_FORMAT}; export the job again with this version of musubi")
    kind, name, kwargs = recipe.get("kind"), str(recipe.get("model")), dict(recipe.get("kwargs") or {})
    model: nn.Module
    if kind == "torchvision-detection":
        from musubi.tasks.detection import MODELS

        if name not in MODELS:
            raise ConfigError(f"build recipe: unknown torchvision detector {name!r}")
        model = MODELS[name][0](**kwargs)
    elif kind == "musubi-detr":
        from musubi.tasks import detr

        model = detr.build_detector(name, int(recipe["num_classes"]), kwargs["model_args"], kwargs["image_size"])
    elif kind == "musubi-effdet":
        from musubi.tasks import efficientdet

        model = efficientdet.build_detector(name, int(recipe["num_classes"]), kwargs["model_args"],
                                            kwargs["image_size"], normalize=bool(kwargs["normalize"]))
    elif kind == "classification":
        from musubi.tasks.classification import create_model

        model = create_model(name, int(recipe["num_classes"]), kwargs["model_args"])
    elif kind == "job":
        from musubi.config.load import job_from_dict
        from musubi.tasks.registry import build_task

        spec = job_from_dict(kwargs["config"])
        model = build_task(spec).build_model()
        return model.eval()  # the task's build_model already adapted its stem
    else:
        raise ConfigError(f"build recipe: unknown kind {kind!r}; export the job again with this version of musubi")
    if recipe.get("stem"):
        from musubi.tasks.stem import adapt_stem

        adapt_stem(model)
    return model.eval()
