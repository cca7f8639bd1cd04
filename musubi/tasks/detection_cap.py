"""How many detections an image keeps: the detector's own post-processing cap and mAP's, as eval.json records them.

Two caps bound a detection mAP: the model's (torchvision's box_detections_per_img = 100 for the R-CNNs,
detections_per_img for RetinaNet, FCOS and SSD, max_detections for the DETR family and EfficientDet) and the
metric's (eval.max_detections, unset = every detection the model returns). When a validation image holds
more objects than the smaller cap, mAP cannot reach 1 however good the model: the record says so and names
the setting to raise.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchvision.models.detection.fcos import FCOS
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from torchvision.models.detection.retinanet import RetinaNet
from torchvision.models.detection.ssd import SSD

from musubi.tasks.detr import DetrDetector
from musubi.tasks.efficientdet import EffDetDetector


def model_cap(model: nn.Module) -> tuple[int | None, str | None]:
    """(the most detections `model` returns for one image, the model_args key that sets it); (None, None) for a
    model whose cap is not known here (a user task's)."""
    if isinstance(model, DistributedDataParallel):
        model = model.module
    if isinstance(model, GeneralizedRCNN):
        return int(model.roi_heads.detections_per_img), "box_detections_per_img"
    if isinstance(model, (RetinaNet, FCOS, SSD)):
        return int(model.detections_per_img), "detections_per_img"
    if isinstance(model, DetrDetector):
        return int(model.detections_per_image), "max_detections"  # or queries x classes, if fewer
    if isinstance(model, EffDetDetector):
        return int(model.max_detections), "max_detections"
    return None, None


def max_detections_record(model: nn.Module, metric_cap: int | None, most_objects: int | None) -> dict[str, Any]:
    """eval.json's "max_detections": the metric's cap ("all" when unset), the model's and what sets each, the
    most objects of a validation image (when known), and a warning when that exceeds either cap."""
    cap, arg = model_cap(model)
    record: dict[str, Any] = {
        "metric": "all" if metric_cap is None else metric_cap,
        "metric_set_by": "eval.max_detections (per image and class; unset: every detection the model returns)",
        "model": cap,
        "model_set_by": f"model_args.{arg}" if arg else "unknown for this model",
    }
    if most_objects is None:
        return record
    record["most_objects_in_a_validation_image"] = most_objects
    limits = [(n, f"model_args.{arg}") for n in (cap,) if n is not None]
    limits += [(n, "eval.max_detections") for n in (metric_cap,) if n is not None]
    short = [(n, key) for n, key in limits if n < most_objects]
    if short:
        n, key = min(short)
        record["warning"] = (f"a validation image holds {most_objects} objects but at most {n} detections an image "
                             f"are kept ({key}): mAP cannot reach 1 on it; raise {key} to at least {most_objects}")
    return record
