"""What to trace for ONNX and what its input means, per task (classification, detection, lm, user tasks)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from musubi.contract.errors import ConfigError
from musubi.evaluate.model_io import JobModel
from musubi.tasks.detr import is_detr_model
from musubi.tasks.efficientdet import is_effdet_model

#: How parity is judged: element-wise on one output tensor, or detection by detection.
CompareKind = Literal["tensor", "detections"]

#: ImageNet statistics (the normalisation of torchvision models and of image-folder data).
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


class DetectorForExport(nn.Module):
    """A torchvision detector as a tensor function: images [1,3,H,W] -> boxes [N,4], scores [N], labels [N]."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.detector = detector

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # torchvision detectors take a list of images and loop over it in Python: tracing fixes the
        # count, so the exported graph takes exactly one image.
        det = self.detector(list(images.unbind(0)))[0]
        return det["boxes"], det["scores"], det["labels"]


class LogitsOnly(nn.Module):
    """A classifier whose output may be a namedtuple (GoogLeNet/Inception): keep the logits tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        out = self.model(x)
        return out.logits if hasattr(out, "logits") else out


@dataclass
class ExportPlan:
    """The module torch.onnx.export traces, its input/output names and axes, and the input's meaning."""

    module: nn.Module
    input_name: str
    output_names: list[str]
    #: Symbolic axes per input/output name (torch.onnx's dynamic_axes).
    dynamic_axes: dict[str, dict[int, str]]
    compare: CompareKind
    #: Host batch (as the task collates it) -> the exported graph's input tensor.
    to_input: Callable[[Any], Tensor]
    #: Exporters to try, in order: "torchscript" (torch.onnx.export(dynamo=False)) or "dynamo".
    exporters: list[str]
    #: dtype, layout, value range and normalisation of the input (the deployment manifest's input spec).
    input_info: dict[str, Any] = field(default_factory=dict)
    #: Host batch -> its ground truth per image (detection: the parity check's mAP on the samples), or None.
    to_targets: Callable[[Any], list[dict[str, Tensor]]] | None = None
    #: Exporters known to fail on this model, with why and what to use instead (refused before any file).
    unsupported: dict[str, str] = field(default_factory=dict)

    @property
    def dynamic_batch(self) -> bool:
        """Whether the input's batch axis is symbolic."""
        return 0 in self.dynamic_axes.get(self.input_name, {})


def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _batch_axes(names: list[str]) -> dict[str, dict[int, str]]:
    return {n: {0: "batch"} for n in names}


def _model_input(job: JobModel, pick: Callable[[Any], Tensor]) -> Callable[[Any], Tensor]:
    """Host batch -> the graph's input, through the task's own to_device (CPU): the conversion training and
    the FPS benchmark apply, so the traced sample is what the model sees (image files load as uint8 and
    become [0, 1] floats there; a detector refuses uint8)."""
    cpu = torch.device("cpu")
    return lambda batch: pick(job.task.to_device(batch, cpu))


def export_plan(job: JobModel) -> ExportPlan:
    """The export plan for a job's task (ConfigError when its inputs are not one tensor)."""
    spec = job.spec
    if spec.task == "detection" and is_detr_model(spec.model):
        return _detr_plan(job)
    if spec.task == "detection" and is_effdet_model(spec.model):
        return _effdet_plan(job)
    if spec.task == "detection":
        size = job.task.image_size  # type: ignore[attr-defined]
        info = _image_info(
            size, f"inside the model: (x - mean) / std, mean={IMAGENET_MEAN}, std={IMAGENET_STD}, "
                  "then resized to the model's min_size..max_size",
            "boxes [N,4] xyxy in input pixels, scores [N], labels [N] (1..classes; 0 is background)")
        # torch.export stops at torchvision's data-dependent detection code (batched_nms branches on
        # the box count; seen with torch 2.11 and 2.14): fail in one line, not after a minute of tracing.
        return _nms_detector_plan(job, info, "resized to the model's min_size..max_size", (
            f"torch.export cannot trace torchvision's {spec.model} (data-dependent control flow in its box "
            "post-processing)"))
    if spec.task == "classification":
        size = job.task.image_size()  # type: ignore[attr-defined]
        on_disk = spec.data.synthetic is None
        norm = (f"before the model: resize + centre crop to {size}, x / 255, then (x - mean) / std, "
                f"mean={IMAGENET_MEAN}, std={IMAGENET_STD}" if on_disk else
                "none: synthetic images are fed as generated (class pattern + Gaussian noise, unbounded floats)")
        return ExportPlan(
            module=LogitsOnly(job.model).eval(),
            input_name="images",
            output_names=["logits"],
            dynamic_axes=_batch_axes(["images", "logits"]),
            compare="tensor",
            to_input=_model_input(job, lambda batch: batch[0]),
            exporters=["torchscript", "dynamo"],
            input_info={"layout": "NCHW, RGB", "dtype": "float32", "size": [size, size],
                        "range": "[0, 1] before normalisation" if on_disk else "unbounded",
                        "normalisation": norm, "outputs": "logits [B, classes]"},
        )
    if spec.task == "lm":
        vocab = job.task.vocab()  # type: ignore[attr-defined]
        return ExportPlan(
            module=job.model,
            input_name="tokens",
            output_names=["logits"],
            dynamic_axes=_batch_axes(["tokens", "logits"]),
            compare="tensor",
            to_input=_model_input(job, lambda batch: batch[0]),
            exporters=["torchscript", "dynamo"],
            input_info={"layout": "[B, T] token ids", "dtype": "int64",
                        "seq_len": job.task.seq_len(),  # type: ignore[attr-defined]
                        "range": f"[0, {vocab})",
                        "normalisation": "none (byte-level tokens for text files)" if spec.data.synthetic is None
                        else "none (synthetic token ids)",
                        "outputs": "next-token logits [B, T, vocab]"},
        )
    return _user_task_plan(job)


def _detr_plan(job: JobModel) -> ExportPlan:
    """A transformers DETR-family detector: one image in (any size, resized inside), its top-k detections out."""
    side = job.model.image_size  # type: ignore[attr-defined]
    keep = job.model.detections_per_image  # type: ignore[attr-defined]
    return ExportPlan(
        module=DetectorForExport(job.model).eval(),
        input_name="images",
        output_names=["boxes", "scores", "labels"],
        dynamic_axes={"images": {2: "height", 3: "width"}},
        compare="detections",
        to_input=_model_input(job, lambda batch: batch[0][0][None]),
        to_targets=lambda batch: job.task.to_device(batch, torch.device("cpu"))[1],
        # Tried first as for torchvision's detectors; torch.export is not yet tried on transformers' models here.
        exporters=["torchscript"],
        input_info=_image_info(
            side, "no normalisation (transformers' RT-DETR/D-FINE processors only rescale to [0, 1]); "
                  f"resized inside the model to {side}x{side} (bilinear)",
            f"the top {keep} (query, class) pairs: boxes [{keep},4] xyxy in input pixels, "
            f"scores [{keep}] (sigmoid, no threshold), labels [{keep}] (1..classes)"),
    )


def _effdet_plan(job: JobModel) -> ExportPlan:
    """An effdet EfficientDet: one image in (any size, resized inside), its NMS'd detections out."""
    spec = job.spec
    side = job.model.image_size  # type: ignore[attr-defined]
    keep = job.model.max_detections  # type: ignore[attr-defined]
    info = _image_info(
        side, f"inside the model: resized to {side}x{side} (bilinear), then (x - mean) / std, "
              f"mean={IMAGENET_MEAN}, std={IMAGENET_STD}",
        f"up to {keep} detections after per-class NMS (IoU 0.5): boxes [N,4] xyxy in input pixels, "
        "scores [N] (sigmoid, no threshold), labels [N] (1..classes)")
    return _nms_detector_plan(job, info, f"resized inside the model to {side}x{side} (bilinear)", (
        f"torch.export cannot trace {spec.model}'s post-processing (effdet's NMS: the box count is "
        "data-dependent; seen with torch 2.14)"))


def _image_info(side: int | None, normalisation: str, outputs: str) -> dict[str, Any]:
    """What a detector's ONNX graph takes (one RGB image, [0, 1] floats) and returns, for the manifest."""
    return {"layout": "NCHW, RGB", "dtype": "float32", "batch": 1, "size": [side, side] if side else None,
            "range": "[0, 1] (pixel / 255)", "normalisation": normalisation, "outputs": outputs}


def _nms_detector_plan(job: JobModel, info: dict[str, Any], resize: str, no_dynamo: str) -> ExportPlan:
    """A detector whose graph takes one image of any size (it resizes inside) and returns its NMS'd
    detections: torchvision's and effdet's. `resize` says how, for a thermal job's normalisation line;
    `no_dynamo` why torch.export cannot trace it (refused in one line, not after a minute of tracing)."""
    spec = job.spec
    if spec.data.channels == 1:
        mean, std = job.task.normalization  # type: ignore[attr-defined]
        info.update(layout="NCHW, 1 channel" if spec.data.one_channel == "stem" else "NCHW, the one channel x3",
                    range="stored units (counts, centikelvin) standardised before the model",
                    normalisation=f"before the model: (x - {mean:.6g}) / {std:.6g} (data.normalize); {resize}")
    return ExportPlan(
        module=DetectorForExport(job.model).eval(),
        input_name="images",
        output_names=["boxes", "scores", "labels"],
        # The detector resizes inside the graph, so any height/width works; one image per call.
        dynamic_axes={"images": {2: "height", 3: "width"}, "boxes": {0: "detections"},
                      "scores": {0: "detections"}, "labels": {0: "detections"}},
        compare="detections",
        to_input=_model_input(job, lambda batch: batch[0][0][None]),
        # targets through to_device too: a decode that resizes (gpu_decode) rescales their boxes alike
        to_targets=lambda batch: job.task.to_device(batch, torch.device("cpu"))[1],
        exporters=["torchscript"],
        unsupported={"dynamo": f"{no_dynamo}; use --exporter torchscript (the default for detectors)"},
        input_info=info,
    )


def _user_task_plan(job: JobModel) -> ExportPlan:
    """User tasks: exported when the batch's first element is the model's only input tensor."""
    from musubi.evaluate.model_io import sample_batch

    batch = job.task.to_device(sample_batch(job.task, 1), torch.device("cpu"))
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else None
    if not isinstance(first, Tensor):
        raise ConfigError(
            f"export: task {job.spec.task!r} batches are not (tensor, ...); only tasks whose model takes the "
            "batch's first tensor can be exported to ONNX"
        )
    with torch.no_grad():
        out = job.model(first)
    if not isinstance(out, Tensor):
        raise ConfigError(
            f"export: the model of task {job.spec.task!r} returns {type(out).__name__}, not a tensor; "
            "wrap it to return one tensor to export it"
        )
    return ExportPlan(
        module=job.model,
        input_name="input",
        output_names=["output"],
        dynamic_axes=_batch_axes(["input", "output"]),
        compare="tensor",
        to_input=_model_input(job, lambda b: b[0]),
        exporters=["torchscript", "dynamo"],
        input_info={"dtype": _dtype_name(first), "shape_per_sample": list(first.shape[1:]),
                    "normalisation": "as the task's data set produces it"},
    )
