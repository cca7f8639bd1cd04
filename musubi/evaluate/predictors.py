"""The models `musubi predict` runs: a job's checkpoint, an ONNX export, a .pt export, a registered model.

Each is a `Predictor` with the model's inference recipe (musubi.evaluate.recipe)
and one method per task. A job's checkpoint runs through the task's own
to_device and predict, the code its evaluation ran; an exported model through the
recipe: the same input conversion and, for a job trained on slices, the same
tiling and merge (musubi.data.slicing.sliced_predict) around the one-tile graph.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.data.slicing import sliced_predict
from musubi.evaluate.predict_sources import HostImage, model_input
from musubi.evaluate.recipe import onnx_recipe
from musubi.store.rundir import read_json

#: NAME or NAME:VERSION of a registered model.
REGISTRY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(:\d+)?$")


@dataclass
class Predictor:
    """A loaded model and its recipe; `detect`/`classify` take host images (predict_sources.read_frame)."""

    recipe: dict[str, Any]
    described: str  # what was loaded, for the console and predictions.json
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def classes(self) -> list[str]:
        """The class names, index order of the model's outputs (detection label i is classes[i - 1])."""
        return list(self.recipe.get("classes") or [])

    @property
    def task(self) -> str:
        """classification or detection."""
        return str(self.recipe.get("task"))

    def detect(self, images: list[HostImage]) -> list[dict[str, Tensor]]:
        """Detections per image ({"boxes" xyxy, "scores", "labels"} in model-input pixels, on the CPU)."""
        raise NotImplementedError

    def classify(self, images: list[HostImage]) -> Tensor:
        """Logits [B, K] (on the CPU)."""
        raise NotImplementedError


def _cpu(out: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
    return [{k: v.detach().cpu() for k, v in d.items()} for d in out]


class JobPredictor(Predictor):
    """A job directory's checkpoint, run through its task exactly as its evaluation ran it."""

    def __init__(self, job_dir: Path, checkpoint: str | int | None, device: torch.device) -> None:
        from musubi.evaluate.model_io import load_job_model
        from musubi.evaluate.recipe import inference_recipe

        self.job = load_job_model(job_dir, checkpoint)
        self.job.model.to(device)
        super().__init__(inference_recipe(self.job), f"{job_dir} (step {self.job.step})", device)

    @property
    def model(self) -> nn.Module:
        """The job's model (eval mode, on this predictor's device)."""
        return self.job.model

    @torch.no_grad()
    def detect(self, images: list[HostImage]) -> list[dict[str, Tensor]]:
        batch = self.job.task.to_device(([h.tensor for h in images], [{} for _ in images]), self.device)
        return _cpu(self.job.task.predict(self.job.model, batch))

    @torch.no_grad()
    def classify(self, images: list[HostImage]) -> Tensor:
        x = torch.stack([h.tensor for h in images]).to(self.device)
        return self.job.task.predict(self.job.model, (x, None)).float().cpu()


def _sliced(run: Any, image: Tensor, rule: dict[str, Any], batch: int) -> dict[str, Tensor]:
    """One frame through `run` (list of tiles -> detections) tiled and merged by the recipe's rule."""
    return sliced_predict(run, image, rule["tile"], rule["overlap"], batch=batch, iou=rule["iou"],
                          max_detections=rule["max_detections"], merge=rule["merge"],
                          match_metric=rule["match_metric"])


class TorchPredictor(Predictor):
    """A `musubi export --format pt` file, rebuilt from the weights.json beside it."""

    def __init__(self, path: Path, device: torch.device) -> None:
        from musubi.tasks.rebuild import rebuild_model

        info_path = path.with_name("weights.json")
        if not info_path.is_file():
            raise ConfigError(f"{path}: no weights.json beside it; export with `musubi export JOB --format pt`, "
                              "which writes both")
        info = read_json(info_path)
        if not isinstance(info.get("recipe"), dict) or not isinstance(info.get("builder"), dict):
            raise ConfigError(f"{info_path}: holds no build or inference recipe (an older export); export the job "
                              "again with `musubi export JOB --format pt`")
        self.model: nn.Module = rebuild_model(info["builder"])
        try:
            self.model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
        except (RuntimeError, OSError, ValueError) as e:
            raise ConfigError(f"{path}: does not load into the model weights.json describes "
                              f"({' '.join(str(e).split())[:160]})") from None
        self.model.eval().to(device)
        super().__init__(info["recipe"], f"{path} (step {info.get('step')})", device)

    @torch.no_grad()
    def detect(self, images: list[HostImage]) -> list[dict[str, Tensor]]:
        inputs = [model_input(h, self.recipe).to(self.device) for h in images]
        rule = self.recipe.get("slice")
        if rule:
            return _cpu([_sliced(self.model, x, rule, max(1, len(inputs))) for x in inputs])
        return _cpu(self.model(inputs))

    @torch.no_grad()
    def classify(self, images: list[HostImage]) -> Tensor:
        out = self.model(torch.stack([h.tensor for h in images]).to(self.device))
        return (out.logits if hasattr(out, "logits") else out).float().cpu()


class OnnxPredictor(Predictor):
    """An ONNX export through ONNX Runtime (one image a call for detectors, as the graph takes)."""

    def __init__(self, path: Path, device: torch.device, described: str | None = None,
                 threads: int | None = None) -> None:
        from musubi.evaluate.fps import onnx_session

        recipe = onnx_recipe(path)
        if recipe is None:
            beside = path.with_name(RUN_FILES.export_record)
            record = read_json(beside) if beside.is_file() else {}
            recipe = record.get("recipe") if isinstance(record, dict) else None
        if not isinstance(recipe, dict):
            raise ConfigError(f"{path}: no musubi inference recipe (not in its metadata, no export.json beside it); "
                              "predict with a file written by `musubi export`, or the job directory")
        self.session, runtime = onnx_session(path, device, threads)  # threads None: onnx_session's default
        self.model: nn.Module | None = None  # no torch module: the graph runs in `session`
        self.input_name = self.session.get_inputs()[0].name
        super().__init__(recipe, described or f"{path} ({runtime})", device)

    def run_one(self, image: Tensor) -> dict[str, Tensor]:
        """One graph call on one model input [C, H, W] (a whole image, or one tile)."""
        boxes, scores, labels = self.session.run(None, {self.input_name: image[None].contiguous().numpy()})[:3]
        return {"boxes": torch.from_numpy(np.asarray(boxes)), "scores": torch.from_numpy(np.asarray(scores)),
                "labels": torch.from_numpy(np.asarray(labels)).long()}

    def detect_input(self, x: Tensor) -> dict[str, Tensor]:
        """Detections of one model input [C, H, W]: one call, or tiled and merged by the recipe's slice rule."""
        rule = self.recipe.get("slice")
        if rule:
            return _sliced(lambda tiles: [self.run_one(t) for t in tiles], x, rule, 1)
        return self.run_one(x)

    def detect(self, images: list[HostImage]) -> list[dict[str, Tensor]]:
        return [self.detect_input(model_input(h, self.recipe)) for h in images]

    def classify(self, images: list[HostImage]) -> Tensor:
        x = torch.stack([h.tensor for h in images]).numpy()
        return torch.from_numpy(np.asarray(self.session.run(None, {self.input_name: x})[0])).float()


def _registered(name: str, db: Path | None) -> tuple[Path, str]:
    """The ONNX file of a registered NAME[:VERSION] (the promoted version, else the newest) and a description."""
    from musubi.evaluate.registry import existing_db, get_model, list_models

    path = existing_db(db)
    base, _, version = name.partition(":")
    if version:
        entry = get_model(base, int(version), db=path)
    else:
        entries = list_models(db=path, name=base)
        if not entries:
            raise ConfigError(f"MODEL {name}: no such job directory, exported file (.onnx, .pt) or model registered "
                              f"in {path} (see `musubi registry list`, or give --db)")
        promoted = [e for e in entries if e["promoted"]]
        entry = (promoted or entries)[-1]
    model = Path(entry["files"][0]["path"])
    if not model.is_file():
        raise ConfigError(f"{model}: the file of {entry['name']} v{entry['version']} is gone; export and register "
                          "it again")
    return model, f"{entry['name']} v{entry['version']} ({model})"


def load_predictor(model: str | Path, checkpoint: str | int | None = None, device: torch.device | None = None,
                   db: Path | None = None) -> Predictor:
    """MODEL as a predictor: a job directory, an exported .onnx or .pt file, or a registry NAME[:VERSION]."""
    dev = device or torch.device("cpu")
    path = Path(model)
    is_job = path.is_dir() and (path / RUN_FILES.job).is_file()
    if checkpoint not in (None, "last") and not is_job:
        raise ConfigError(f"--checkpoint {checkpoint}: picks a job's checkpoint; MODEL {model} is not a job "
                          "directory (an export holds the one checkpoint it was made from)")
    if is_job:
        from musubi.evaluate.model_io import is_task_job

        if not is_task_job(path):
            raise ConfigError(f"{path}: an external job; predict with the model file its program wrote "
                              f"({path / RUN_FILES.onnx}) if it is a musubi export, or with its own tools")
        return JobPredictor(path, checkpoint, dev)
    if path.is_dir():
        for candidate in (path / RUN_FILES.export / RUN_FILES.onnx, path / RUN_FILES.onnx):
            if candidate.is_file():
                return OnnxPredictor(candidate, dev)
        raise ConfigError(f"{path}: not a job directory (no job.json) and holds no export/model.onnx; give RUN/JOB, "
                          "an exported file or a registered name")
    if path.is_file():
        if path.suffix == ".onnx":
            return OnnxPredictor(path, dev)
        if path.suffix == ".pt":
            return TorchPredictor(path, dev)
        raise ConfigError(f"{path}: not a model file predict reads; give a .onnx or .pt export, or a job directory")
    if REGISTRY_NAME.match(str(model)):
        file, described = _registered(str(model), db)
        return OnnxPredictor(file, dev, described)
    raise ConfigError(f"MODEL {model}: no such job directory, exported file (.onnx, .pt) or registered name")
