"""`musubi evaluate JOB --predictions FILE`: a detection job's predictions as a COCO results file.

The file is what pycocotools' `COCO.loadRes` and faster-coco-eval read: a list of
{image_id, category_id, bbox [x, y, w, h], score}, with the image ids and category
ids of the validation annotation file and boxes in the pixels of its image files
(a job that resizes, data.image_size, has its boxes scaled back). So a user scores
the model with the tool they trust against the file they labelled. The images are
the whole frames the file lists; a sliced job predicts on their tiles and merges,
as its validation does. With a class map (data.classes) the ids are those of the
mapped categories, and the ground truth as the job reads it is written beside the
results (`<FILE stem>.ground_truth.json`), since the labelled file has other classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from musubi.contract.errors import ConfigError
from musubi.data.classmap import apply_class_map
from musubi.data.coco import CocoDetection, read_annotation_json
from musubi.evaluate.fps import resolve_device
from musubi.evaluate.model_io import load_job_model

#: Images per forward while predicting.
BATCH = 4


def _val_frames(job: Any) -> CocoDetection:
    """The job's validation split as whole frames from its annotation file (ConfigError when it has none)."""
    spec = job.spec
    data = spec.data
    if spec.task != "detection":
        raise ConfigError(f"--predictions: job {spec.name!r} is a {spec.task} job; COCO results are for detection")
    if data.val is None or data.val.annotations is None:
        raise ConfigError(f"--predictions: job {spec.name!r} has no COCO validation split (data.val with "
                          "annotations); set data.val, or predict with the model from Python")
    train = job.task.train_dataset()
    return CocoDetection(data.val.path, data.val.annotations, image_size=data.image_size,
                         category_ids=train.category_ids, as_uint8=True, max_image_pixels=data.max_image_pixels,
                         classes=data.classes, channels=data.channels)


def coco_results(image_id: int, out: dict[str, torch.Tensor], category_ids: tuple[int, ...],
                 scale: tuple[float, float]) -> list[dict[str, Any]]:
    """COCO result rows of one image's detections (xyxy in model-input pixels, labels 1..K) in file pixels."""
    sx, sy = scale
    rows = []
    for box, score, label in zip(out["boxes"].tolist(), out["scores"].tolist(), out["labels"].tolist(), strict=True):
        if not 1 <= label <= len(category_ids):
            continue  # background (0) is never a class of the file
        x1, y1, x2, y2 = box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy
        rows.append({"image_id": image_id, "category_id": category_ids[label - 1],
                     "bbox": [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)],
                     "score": round(float(score), 5)})
    return rows


@torch.no_grad()
def write_predictions(job_dir: Path, out: Path, device: str | None = None,
                      checkpoint: str | int | None = None) -> dict[str, Any]:
    """Predict every image of the job's validation file and write COCO results JSON to `out`; return a summary."""
    out = Path(out)
    if out.exists() and not out.is_file():
        raise ConfigError(f"--predictions {out}: is a folder; give a file name such as predictions.json")
    if not out.parent.is_dir():
        raise ConfigError(f"--predictions {out}: folder {out.parent} does not exist; create it first")
    job = load_job_model(job_dir, checkpoint)
    frames = _val_frames(job)
    dev = resolve_device(device)
    model = job.model.to(dev)
    rows: list[dict[str, Any]] = []
    for start in range(0, len(frames), BATCH):
        samples = [frames[i] for i in range(start, min(start + BATCH, len(frames)))]
        outputs = job.task.predict(model, job.task.to_device(job.task.collate(samples), dev))
        for n, ((image, target), pred) in enumerate(zip(samples, outputs, strict=True)):
            w, h = frames.file_size(start + n)
            scale = (w / image.shape[-1], h / image.shape[-2])  # model input -> file pixels
            rows += coco_results(int(target["image_id"]), {k: v.cpu() for k, v in pred.items()},
                                 frames.category_ids, scale)
    tmp = out.with_name(f".{out.name}.partial")
    tmp.write_text(json.dumps(rows), encoding="utf-8")
    tmp.replace(out)  # a half-written results file never exists under its name
    summary: dict[str, Any] = {"file": str(out), "detections": len(rows), "images": len(frames),
                               "annotations": str(job.spec.data.val.annotations), "checkpoint_step": job.step}
    if job.spec.data.classes:
        ann = Path(str(job.spec.data.val.annotations))
        truth = out.with_name(f"{out.stem}.ground_truth.json")
        truth.write_text(json.dumps(apply_class_map(read_annotation_json(ann), job.spec.data.classes, ann)),
                         encoding="utf-8")
        summary["annotations"] = str(truth)
    return summary
