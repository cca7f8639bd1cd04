"""`musubi predict MODEL SOURCE` and `musubi.predict(...)`: a trained or exported model on new images.

MODEL is a job directory (its best, last or a given checkpoint), an exported
.onnx or .pt file, or a registered NAME[:VERSION]; SOURCE an image, a folder, a
glob, a video's frames or numpy arrays (predict_sources). Frames are read as
evaluation read the validation files, so `predict` on them gives the boxes of
`musubi evaluate --predictions` for the same checkpoint; a job trained on slices
is tiled and merged as its evaluation was. With an output folder it writes
predictions.json (COCO results: image_id, file_name, category_id, category_name,
bbox [x, y, w, h] in file pixels, score) and, with `save_images`, each image with
its boxes drawn.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from musubi.contract.errors import ConfigError
from musubi.evaluate.predict_sources import Frame, HostImage, read_frame, resolve_source
from musubi.evaluate.predictions import coco_results
from musubi.evaluate.predictors import Predictor, load_predictor

PREDICTIONS_FILE, IMAGES_DIR = "predictions.json", "images"
#: Frames per forward: the batch `musubi evaluate --predictions` uses, so a job's boxes match it.
BATCH = 4


@dataclass
class ImageResult:
    """One frame's predictions in its own pixels: detections (boxes xyxy) or a classification."""

    name: str
    image_id: int
    width: int
    height: int
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))  # [N, 4] xyxy, file pixels
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0))
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # detection 1..K, class 0..K-1
    names: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One human line: `a.png: 3 detections (car 2, person 1), best 0.91` or `a.png: cat 0.93`."""
        if not len(self.scores):
            return f"{self.name}: no detections"
        if len(self.names) == 1 and len(self.boxes) == 0:
            return f"{self.name}: {self.names[0]} {float(self.scores[0]):.3f}"
        counts: dict[str, int] = {}
        for n in self.names:
            counts[n] = counts.get(n, 0) + 1
        parts = ", ".join(f"{n} {c}" for n, c in sorted(counts.items(), key=lambda kv: -kv[1]))
        return f"{self.name}: {len(self.scores)} detection{'s' * (len(self.scores) != 1)} ({parts}), " \
               f"best {float(self.scores.max()):.3f}"


@dataclass
class PredictResult:
    """What a predict call found, where it wrote it, and with which model."""

    model: str
    task: str
    classes: list[str]
    images: list[ImageResult]
    rows: list[dict[str, Any]]  # COCO-format results
    out: Path | None = None
    recipe: dict[str, Any] = field(default_factory=dict)


def _name(classes: list[str], index: int) -> str:
    return classes[index] if 0 <= index < len(classes) else str(index)


def _detections(frame: Frame, image_id: int, host: HostImage, out: dict[str, torch.Tensor],
                recipe: dict[str, Any], conf: float | None) -> tuple[ImageResult, list[dict[str, Any]]]:
    classes = recipe.get("classes") or []
    ids = tuple(recipe.get("category_ids") or range(1, len(classes) + 1))
    keep = out["scores"] >= conf if conf is not None else torch.ones_like(out["scores"], dtype=torch.bool)
    kept = {k: v[keep] for k, v in out.items()}
    rows = coco_results(image_id, kept, ids, host.scale)
    for row in rows:
        row["file_name"] = frame.name
        row["category_name"] = _name(classes, ids.index(row["category_id"]))
    sx, sy = host.scale
    boxes = kept["boxes"].double().numpy() * np.array([sx, sy, sx, sy])
    labels = kept["labels"].numpy()
    result = ImageResult(frame.name, image_id, host.width, host.height, boxes, kept["scores"].double().numpy(),
                         labels, [_name(classes, int(lab) - 1) for lab in labels])
    return result, rows


def _classification(frame: Frame, image_id: int, host: HostImage, logits: torch.Tensor,
                    recipe: dict[str, Any], conf: float | None) -> tuple[ImageResult, list[dict[str, Any]]]:
    classes = recipe.get("classes") or []
    probs = logits.softmax(-1)
    score, label = (float(v) for v in probs.max(-1))
    label = int(label)
    if conf is not None and score < conf:
        return ImageResult(frame.name, image_id, host.width, host.height), []
    row = {"image_id": image_id, "file_name": frame.name, "category_id": label,
           "category_name": _name(classes, label), "score": round(score, 5)}
    return ImageResult(frame.name, image_id, host.width, host.height, np.zeros((0, 4)), np.array([score]),
                       np.array([label]), [_name(classes, label)]), [row]


def _draw(result: ImageResult, host: HostImage, folder: Path) -> Path:
    """The frame with its boxes (or its class) drawn, as OUT/images/<name>.png."""
    from PIL import Image, ImageDraw

    image = torch.from_numpy(np.array(host.rgb, dtype=np.uint8)).permute(2, 0, 1)  # a writable copy
    if len(result.boxes):
        from torchvision.utils import draw_bounding_boxes

        palette = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#46f0f0", "#f032e6", "#bcf60c"]
        labels = [f"{n} {s:.2f}" for n, s in zip(result.names, result.scores.tolist(), strict=True)]
        colors = [palette[int(lab) % len(palette)] for lab in result.labels.tolist()]
        image = draw_bounding_boxes(image, torch.from_numpy(result.boxes).float(), labels=labels, colors=colors,
                                    width=2)
    pil = Image.fromarray(image.permute(1, 2, 0).numpy())
    if not len(result.boxes) and result.names:
        ImageDraw.Draw(pil).text((4, 4), f"{result.names[0]} {float(result.scores[0]):.2f}", fill=(255, 0, 0))
    path = folder / (result.name.replace("/", "__").replace("#", "_") + ".png")
    pil.save(path)
    return path


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file; give a folder (predictions.json and images/ are written in it)")
    if (out / PREDICTIONS_FILE).exists():
        raise ConfigError(f"--out {out}: already holds {PREDICTIONS_FILE}; give a new folder (nothing is "
                          "overwritten)")


def check_request(out: Path | None, conf: float | None, save_images: bool) -> None:
    """Refuse a bad --conf, --save-images without --out, or an --out that holds predictions already: called before
    the model loads (a detector's load takes seconds), and again by run_predict."""
    if conf is not None and not 0.0 <= conf <= 1.0:
        raise ConfigError(f"--conf {conf}: a score threshold in [0, 1], e.g. 0.25")
    if save_images and out is None:
        raise ConfigError("save_images needs an output folder (--out DIR)")
    if out is not None:
        _check_out(out)


def run_predict(predictor: Predictor, frames: list[Frame], out: Path | None = None, conf: float | None = None,
                save_images: bool = False, on_image: Callable[[ImageResult], None] | None = None,
                batch: int = BATCH) -> PredictResult:
    """Run a loaded predictor over frames in batches; write OUT/predictions.json (and images/) when `out` is set."""
    recipe = predictor.recipe
    task = recipe.get("task")
    if task not in ("detection", "classification"):
        raise ConfigError(f"predict: the model is a {task!r} model; predict runs detection and classification")
    check_request(out, conf, save_images)
    drawn = None
    if out is not None and save_images:
        drawn = out / IMAGES_DIR
        drawn.mkdir(parents=True, exist_ok=True)
    results: list[ImageResult] = []
    rows: list[dict[str, Any]] = []
    for start in range(0, len(frames), batch):
        chunk = frames[start:start + batch]
        hosts = [read_frame(f, recipe) for f in chunk]
        if task == "detection":
            outs: list[Any] = predictor.detect(hosts)
        else:
            outs = list(predictor.classify(hosts).unbind(0))
        for n, (frame, host, pred) in enumerate(zip(chunk, hosts, outs, strict=True)):
            make = _detections if task == "detection" else _classification
            result, found = make(frame, start + n + 1, host, pred, recipe, conf)
            results.append(result)
            rows += found
            if drawn is not None:
                _draw(result, host, drawn)
            if on_image is not None:
                on_image(result)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".{PREDICTIONS_FILE}.partial"
        tmp.write_text(json.dumps(rows), encoding="utf-8")
        tmp.replace(out / PREDICTIONS_FILE)  # never a half-written results file under its name
        (out / "predict.json").write_text(json.dumps({
            "model": predictor.described, "task": task, "classes": recipe.get("classes"), "images": len(frames),
            "detections" if task == "detection" else "classified": len(rows), "conf": conf,
            "recipe": recipe, "created": dt.datetime.now(dt.timezone.utc).isoformat()}, indent=1), encoding="utf-8")
    return PredictResult(predictor.described, task, list(recipe.get("classes") or []), results, rows, out, recipe)


def predict(model: str | Path | Predictor, source: Any, *, out: str | Path | None = None,
            checkpoint: str | int | None = None, conf: float | None = None, save_images: bool = False,
            device: str | None = None, db: str | Path | None = None,
            on_image: Callable[[ImageResult], None] | None = None) -> PredictResult:
    """Predict with MODEL (job dir, .onnx/.pt export, registry NAME[:VERSION], or a Predictor already loaded by
    `musubi.load`) on SOURCE (image, folder, glob, video, numpy array or a list of them); results in file pixels
    with class names."""
    from musubi.evaluate.fps import resolve_device

    if isinstance(model, Predictor) and (checkpoint not in (None, "last") or device is not None or db is not None):
        raise ConfigError(f"model {model.described}: already loaded; its checkpoint, device and db were chosen "
                          "when it was loaded (give them to musubi.load)")
    frames = resolve_source(source)
    folder = Path(out) if out is not None else None
    check_request(folder, conf, save_images)  # before the load: a bad option costs no model load
    predictor = model if isinstance(model, Predictor) else \
        load_predictor(model, checkpoint, resolve_device(device), Path(db) if db is not None else None)
    return run_predict(predictor, frames, folder, conf, save_images, on_image)
