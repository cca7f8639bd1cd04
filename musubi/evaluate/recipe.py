"""The inference recipe: what turns a file into the model's input and its outputs into named results.

One JSON object, written with every export (export.json, weights.json, the ONNX
file's metadata_props), copied into the registry and the deployment manifest, and
read by `musubi predict` and examples/edge: the task, the class names, how an image
is read, resized and normalised exactly as evaluation read the validation files,
and for a job trained on slices the tile, overlap and merge rule its whole-frame
mAP and FPS were measured with. The deployable unit is what was measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.data.slicing import MAX_MERGED_DETECTIONS, MERGE_LIMIT
from musubi.evaluate.export_plan import IMAGENET_MEAN, IMAGENET_STD
from musubi.evaluate.model_io import JobModel

RECIPE_FORMAT = "musubi-inference/1"
#: ONNX metadata_props keys (onnx.ModelProto.metadata_props: string pairs every ONNX reader keeps).
META_RECIPE, META_CLASSES = "musubi.recipe", "musubi.classes"


def slice_rule(spec: Any) -> dict[str, Any] | None:
    """The tiling and merge of a job evaluated on whole frames from tiles (data.slice with sliced_eval), else None."""
    sl = spec.data.slice
    if sl is None or not sl.sliced_eval or spec.data.synthetic is not None:
        return None
    return {"tile": sl.tile, "overlap": sl.overlap, "merge": sl.merge, "match_metric": sl.match_metric,
            "iou": sl.nms_iou, "max_detections": MAX_MERGED_DETECTIONS, "merge_limit": MERGE_LIMIT,
            "grid": "stride = int(tile * (1 - overlap)); starts 0, stride, ... and a last one ending at the border; "
                    "a side shorter than the tile is one shorter tile (no padding)",
            "rule": ("nmm: per class, best score first, a box absorbs every lower box overlapping it by >= iou "
                     "(match_metric ios: intersection over the smaller box) and grows to their union"
                     if sl.merge == "nmm" else "nms: per class, torchvision batched_nms at iou"),
            "batch": "tiles of one frame in chunks (evaluation: the validation batch size); the result does not "
                     "depend on it"}


def _detection_input(job: JobModel) -> dict[str, Any]:
    data = job.spec.data
    if data.channels == 1:
        mean, std = job.task.normalization  # type: ignore[attr-defined]
        return {"channels": 1, "read": "single channel as stored (8/16-bit PNG or TIFF), float32",
                "resize_longest": data.image_size, "resample": "bilinear, antialias (torch.nn.functional.interpolate)",
                "scale": 1.0, "mean": [float(mean)], "std": [float(std)],
                "replicate": data.one_channel == "replicate",
                "layout": "NCHW, batch 1" + (", the channel repeated 3 times" if data.one_channel == "replicate"
                                              else ", 1 channel")}
    return {"channels": 3, "read": "RGB (PIL convert('RGB'))", "resize_longest": data.image_size,
            "resample": "bilinear (PIL Image.resize)", "scale": 1 / 255, "mean": [0.0, 0.0, 0.0],
            "std": [1.0, 1.0, 1.0], "replicate": False,
            "layout": "NCHW, batch 1, float32 in [0, 1]; the detector normalises and resizes inside"}


def _classification_input(job: JobModel) -> dict[str, Any]:
    size = job.task.image_size()  # type: ignore[attr-defined]
    synthetic = job.spec.data.synthetic is not None
    return {"channels": 3, "read": "RGB (PIL convert('RGB'))", "resize_shorter": size, "center_crop": size,
            "resample": "bilinear (torchvision Resize)", "scale": 1 / 255,
            "mean": [0.0] * 3 if synthetic else IMAGENET_MEAN, "std": [1.0] * 3 if synthetic else IMAGENET_STD,
            "replicate": False, "layout": "NCHW, float32",
            **({"note": "trained on generated patterns: real images are out of its distribution"} if synthetic
               else {})}


def inference_recipe(job: JobModel) -> dict[str, Any]:
    """The recipe of a loaded job (its class names, input, outputs, slicing and what its figures measure)."""
    spec, task = job.spec, job.task
    out: dict[str, Any] = {"format": RECIPE_FORMAT, "task": spec.task, "model": spec.model, "job": spec.name,
                           "step": job.step,
                           # what the checkpoint recorded, else what the data says now (an older checkpoint)
                           "classes": job.classes if job.classes is not None else task.class_names()}
    if spec.task == "detection":
        rule = slice_rule(spec)
        out.update(category_ids=task.category_ids(),  # type: ignore[attr-defined]
                   labels="label L (1..K) is classes[L - 1] and category_ids[L - 1] of the annotation file; "
                          "0 is background",
                   input=_detection_input(job),
                   outputs="boxes [N,4] xyxy in input pixels, scores [N], labels [N]",
                   slice=rule,
                   measured={"metrics": "whole frame: tiles predicted, shifted and merged by slice"
                             if rule else "whole image", "fps": "whole frame, tiling and merging included"
                             if rule else "whole image"})
    elif spec.task == "classification":
        out.update(input=_classification_input(job), outputs="logits [B, K]; label i is classes[i]",
                   measured={"metrics": "whole image", "fps": "whole image"})
    else:
        out.update(input=None, outputs="the task's own", measured={})
    return out


def stamp_onnx(path: Path, recipe: dict[str, Any]) -> Any:
    """Write the recipe and the class names into an ONNX file's metadata_props (in place); return the stamped
    ModelProto (the exporter reads its inputs and outputs from it instead of loading the file again)."""
    import onnx

    model = onnx.load(str(path))
    keep = [p for p in model.metadata_props if p.key not in (META_RECIPE, META_CLASSES)]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for key, value in ((META_RECIPE, recipe), (META_CLASSES, recipe.get("classes"))):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    onnx.save(model, str(path))
    return model


def onnx_recipe(path: Path) -> dict[str, Any] | None:
    """The recipe stamped into an ONNX file, or None when it has none (an external program's model)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - onnx reports a bad file in several ways
        raise ConfigError(f"{path}: not a readable ONNX file ({' '.join(str(e).split())[:160]})") from None
    for prop in model.metadata_props:
        if prop.key == META_RECIPE:
            try:
                value = json.loads(prop.value)
            except ValueError:
                raise ConfigError(f"{path}: its {META_RECIPE} metadata is not JSON; export the job again") from None
            return value if isinstance(value, dict) else None
    return None
