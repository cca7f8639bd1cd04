"""EfficientDet from Ross Wightman's `effdet` (timm backbones) as built-in detection models.

The model, its anchors, anchor labeler and focal + Huber loss are effdet's own
(`EfficientDet` inside `DetBenchTrain`), built from `get_efficientdet_config`
with `pretrained_backbone=False`: random init or a local weights file, nothing
downloaded. `EffDetDetector` gives it torchvision's detection interface (a list
of images in, a loss dict in train mode, per-image {"boxes", "scores",
"labels"} in the input image's pixels in eval mode), so the detection task, its
mAP, FPS and ONNX export treat it like any other detector.

`effdet` (with timm and omegaconf) is the optional extra `musubi-train[effdet]`;
naming one of these models without it is a one-line error before launch.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from importlib.util import find_spec
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from musubi.contract.errors import ConfigError

EXTRA_MESSAGE = "model {model}: needs effdet (EfficientDet, with timm): pip install 'musubi-train[effdet]'"

#: Model name -> effdet config name. effdet's `efficientdet_*` configs (PyTorch padding, not the TF ports'
#: dynamic 'same' padding, which costs speed and a data-dependent pad in an exported graph).
PRESETS: dict[str, str] = {f"efficientdet_d{i}": f"efficientdet_d{i}" for i in range(4)}
MODELS = frozenset(PRESETS)

#: ImageNet statistics: effdet's loaders normalise with them (timm's EfficientNet backbones expect them).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: model_args Musubi applies itself: the model's input side, detections kept per image, BatchNorm momentum
#: (the detection task sets it after building, as for torchvision's models).
OWN_MODEL_ARGS = frozenset({"image_size", "max_detections", "bn_momentum"})
#: Prefix of model_args passed to the timm backbone (backbone_drop_path_rate: 0.0).
BACKBONE_PREFIX = "backbone_"
#: Config fields Musubi sets itself, that are not YAML scalars, or that name a download.
_RESERVED = frozenset({"name", "num_classes", "num_levels", "image_size", "max_det_per_image", "url",
                       "backbone_args", "backbone_indices", "aspect_ratios", "norm_layer", "norm_kwargs",
                       "fpn_config"})
#: timm create_model arguments that would load weights or change the backbone's output contract.
_RESERVED_BACKBONE = frozenset({"pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path",
                                "features_only", "out_indices", "num_classes", "in_chans", "cache_dir"})


def is_effdet_model(name: str) -> bool:
    """True when `name` is one of the EfficientDet presets."""
    return name in PRESETS


def require_effdet(model: str) -> None:
    """ConfigError naming the extra when effdet (or its timm / omegaconf) is not installed."""
    if any(find_spec(m) is None for m in ("effdet", "timm", "omegaconf")):
        raise ConfigError(EXTRA_MESSAGE.format(model=model))


def preload() -> None:
    """Import effdet (with timm), what building an EfficientDet imports first, building nothing."""
    _effdet()


def _effdet() -> Any:
    """The effdet package, imported on demand (heavy) with the hub switched off."""
    # timm must never reach for the hub: the backbone is built with pretrained=False, this is the belt.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings():
        # effdet scripts a few functions at import; torch 2.14 calls torch.jit.script deprecated.
        warnings.simplefilter("ignore", FutureWarning)
        import effdet
        import effdet.anchors
    return effdet


def _base_config(model: str) -> Any:
    require_effdet(model)
    return _effdet().get_efficientdet_config(PRESETS[model])


def _fields(config: Any) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _RESERVED}


def _is_backbone_arg(key: str, fields: dict[str, Any]) -> bool:
    """backbone_<x> not itself a config field (backbone_name is one) goes to timm's create_model."""
    return key.startswith(BACKBONE_PREFIX) and key not in fields


def accepted_model_args(model: str, given: dict[str, Any] | None = None) -> frozenset[str]:
    """model_args an EfficientDet takes: effdet's scalar config fields, Musubi's own, and the backbone_<timm
    argument> names among `given` (timm's arguments are open-ended; those that load weights are refused)."""
    fields = _fields(_base_config(model))
    backbone = {k for k in given or {} if _is_backbone_arg(k, fields)
                and k[len(BACKBONE_PREFIX):] not in _RESERVED_BACKBONE}
    return frozenset(set(fields) | OWN_MODEL_ARGS | backbone)


def check_model_args(model: str, model_args: dict[str, Any]) -> None:
    """ConfigError (one line, listing the accepted names) for a model_arg an EfficientDet does not take."""
    unknown = sorted(set(model_args) - accepted_model_args(model, model_args))
    if unknown:
        fields = _fields(_base_config(model))
        raise ConfigError(f"model_args: {model} takes no {', '.join(unknown)}; it takes "
                          f"{', '.join(sorted(set(fields) | OWN_MODEL_ARGS))} and backbone_<timm argument>")


def _own_int(model_args: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = model_args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"model_args.{key}: must be an integer >= {minimum}, not {value!r}")
    return value


def build_config(model: str, num_classes: int, model_args: dict[str, Any], side: int, keep: int) -> Any:
    """effdet's config of a preset with `model_args` applied (Musubi's own excluded); ConfigError on a bad one."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    check_model_args(model, model_args)
    config = _base_config(model)
    fields = _fields(config)
    backbone_args = dict(config.backbone_args or {})
    try:
        for key, value in model_args.items():
            if key in OWN_MODEL_ARGS:
                continue
            if key in fields:
                setattr(config, key, value)
            else:
                backbone_args[key[len(BACKBONE_PREFIX):]] = value
        config.backbone_args = OmegaConf.create(backbone_args)
        config.num_levels = config.max_level - config.min_level + 1
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise ConfigError(f"model_args: {model} rejected them ({' '.join(str(e).split())[:200]}); "
                          "fix model_args") from None
    stride = 2 ** config.max_level
    if side % stride:
        raise ConfigError(f"model {model}: image side {side} is not a multiple of {stride} (2^max_level); set "
                          f"data.image_size or model_args.image_size to one (e.g. {max(stride, side // stride * stride)})"
                          " or lower model_args.max_level")
    config.image_size = (side, side)
    config.num_classes = num_classes
    config.max_det_per_image = keep
    return config


class EffDetDetector(nn.Module):
    """effdet's EfficientDet (inside its DetBenchTrain) with torchvision's detection interface.

    Input: a list of float images [C, H, W] in [0, 1] (or already standardised single-channel frames, then
    `normalize` is off), each resized (bilinear) to image_size x image_size: effdet's anchors are fixed to
    that side. Targets: torchvision's {"boxes" xyxy pixels, "labels" 1..K}. Train mode returns effdet's
    loss as its two terms, {"loss_class": focal, "loss_box": box_loss_weight x Huber}, whose sum is
    DetBenchTrain's loss. Eval mode returns effdet's post-processing: the top max_detection_points
    (anchor, class) logits, decoded and NMS'd (IoU 0.5, per class) by `effdet.anchors.generate_detections`,
    at most max_detections per image, boxes xyxy in that image's pixels, labels 1..K.
    """

    def __init__(self, bench: nn.Module, image_size: int, max_detections: int, normalize: bool) -> None:
        super().__init__()
        self.bench = bench
        self.image_size = image_size
        self.max_detections = max_detections
        self.normalize = normalize

    @property
    def config(self) -> Any:
        """effdet's config (omegaconf) of the model."""
        return self.bench.config

    def _pixels(self, images: Sequence[Tensor]) -> Tensor:
        """[B, C, S, S]: each image resized to the model's side (skipped when it already is, except while
        tracing, so an exported graph resizes any input), then ImageNet-normalised unless told not to."""
        size = (self.image_size, self.image_size)
        tracing = torch.jit.is_tracing()
        x = torch.stack([
            im if tuple(im.shape[-2:]) == size and not tracing
            else F.interpolate(im[None], size=size, mode="bilinear", align_corners=False)[0]
            for im in images
        ])
        if not self.normalize:
            return x
        mean = torch.tensor(IMAGENET_MEAN, device=x.device, dtype=x.dtype)[:, None, None]
        std = torch.tensor(IMAGENET_STD, device=x.device, dtype=x.dtype)[:, None, None]
        return (x - mean) / std

    def forward(self, images: Sequence[Tensor], targets: Sequence[dict[str, Tensor]] | None = None) -> Any:
        pixels = self._pixels(images)
        if self.training:
            if targets is None:
                raise RuntimeError("EffDetDetector: train mode needs targets (boxes, labels)")
            boxes, classes = zip(*(self._label(im, t) for im, t in zip(images, targets, strict=True)), strict=True)
            out = self.bench(pixels, {"bbox": list(boxes), "cls": list(classes)})
            return {"loss_class": out["class_loss"], "loss_box": self.config.box_loss_weight * out["box_loss"]}
        class_out, box_out = self.bench.model(pixels)
        return self._detections(class_out, box_out, images)

    def _label(self, image: Tensor, target: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """effdet's label format: boxes (y0, x0, y1, x1) in the model's pixels, classes 1..K as floats."""
        h, w = image.shape[-2:]
        x0, y0, x1, y1 = target["boxes"].to(torch.float32).unbind(-1)
        sy, sx = self.image_size / h, self.image_size / w
        yxyx = torch.stack([y0 * sy, x0 * sx, y1 * sy, x1 * sx], -1).reshape(-1, 4)
        return yxyx, target["labels"].to(torch.float32)

    def _detections(self, class_out: list[Tensor], box_out: list[Tensor],
                    images: Sequence[Tensor]) -> list[dict[str, Tensor]]:
        """Per level [B, A*K, h, w] logits and [B, A*4, h, w] box codes -> per image detections in its pixels."""
        generate_detections = _effdet().anchors.generate_detections
        config = self.config
        batch, classes = class_out[0].shape[0], config.num_classes
        # As effdet's bench: every level flattened to [B, anchors, K] and [B, anchors, 4], anchor order.
        logits = torch.cat([c.permute(0, 2, 3, 1).reshape(batch, -1, classes) for c in class_out], 1)
        codes = torch.cat([b.permute(0, 2, 3, 1).reshape(batch, -1, 4) for b in box_out], 1)
        # The top max_detection_points (anchor, class) pairs go to NMS (fewer when a small input has fewer).
        k = min(int(config.max_detection_points), logits.shape[1] * classes)
        top_logits, top = logits.reshape(batch, -1).topk(k, dim=1)  # [B, k]: logits, index of (anchor, class)
        anchor = torch.div(top, classes, rounding_mode="floor")
        cls = top % classes
        out = []
        for i, image in enumerate(images):
            # [max_detections, 6]: x0, y0, x1, y1 (model pixels), score, class 1..K; zero rows pad it out.
            det = generate_detections(
                top_logits[i, :, None], codes[i].gather(0, anchor[i, :, None].expand(-1, 4)), self.bench.anchors.boxes,
                anchor[i], cls[i], None, None, max_det_per_image=self.max_detections,
                soft_nms=bool(config.soft_nms))
            # Padding rows have class 0; dropped here, so an exported graph is right whatever it traced.
            det = det[det[:, 5] > 0]
            h, w = image.shape[-2:]
            # as_tensor keeps the sizes symbolic while tracing: the exported graph scales to any input size.
            wh = torch.stack([torch.as_tensor(w), torch.as_tensor(h)]).to(device=det.device, dtype=det.dtype)
            frame = torch.cat([wh, wh])
            # Clipped to the image, as torchvision's detectors do (effdet clips only given its img_size).
            boxes = torch.minimum((det[:, :4] * (frame / self.image_size)).clamp(min=0), frame)
            out.append({"boxes": boxes, "scores": det[:, 4], "labels": det[:, 5].to(torch.int64)})
        return out


def build_detector(model: str, num_classes: int, model_args: dict[str, Any], image_size: int | None,
                   normalize: bool = True) -> EffDetDetector:
    """A freshly initialised (seeded by the caller) EfficientDet of the named preset, on the current device.

    `normalize=False` for inputs standardised before the model (single-channel frames by their data set's
    statistics); otherwise the model ImageNet-normalises [0, 1] RGB itself.
    """
    preset_side = int(_base_config(model).image_size[0])
    side = _own_int(model_args, "image_size", image_size or preset_side, 1)
    keep = _own_int(model_args, "max_detections", int(_base_config(model).max_det_per_image), 1)
    config = build_config(model, num_classes, model_args, side, keep)
    effdet = _effdet()
    try:
        net = effdet.EfficientDet(config, pretrained_backbone=False)
        bench = effdet.DetBenchTrain(net, create_labeler=True)
    except (TypeError, ValueError, RuntimeError, KeyError, AssertionError) as e:
        raise ConfigError(f"model_args: {model} cannot be built from them ({' '.join(str(e).split())[:200]}); "
                          "fix model_args") from None
    return EffDetDetector(bench, side, keep, normalize)
