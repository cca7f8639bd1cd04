"""DETR-family detectors from Hugging Face `transformers`: RT-DETR (v1, v2) and D-FINE, as built-in detection models.

The models, their losses (Hungarian matching, varifocal/L1/GIoU, denoising and
auxiliary terms, D-FINE's distribution losses) are transformers' own; Musubi
adds named size presets, a config built from them (random init, nothing
downloaded: no hub id ever reaches transformers), and `DetrDetector`, which
gives the model torchvision's detection interface (a list of images in, a loss
dict in train mode, per-image {"boxes", "scores", "labels"} in eval mode), so
the detection task, its mAP, FPS and ONNX export treat it like any other.

`transformers` (and `scipy`, which its Hungarian matcher needs) are the
optional extra `musubi-train[transformers]`; naming one of these models
without it is a one-line error before launch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from musubi.contract.errors import ConfigError

EXTRA_MESSAGE = "model {model}: needs Hugging Face transformers and scipy: pip install 'musubi-train[transformers]'"

#: Side (pixels) a DETR model sees when the job says no image size: the presets' published input (640x640).
DEFAULT_IMAGE_SIZE = 640
#: Detections kept per image (top scores over queries x classes, as transformers' post-processing): COCO's 100.
DEFAULT_MAX_DETECTIONS = 100
#: Every side is a multiple of this: the encoder's coarsest feature map has stride 32.
STRIDE = 32


@dataclass(frozen=True)
class Preset:
    """A named size: the transformers family, its backbone config fields and its detector config fields."""

    family: str  # "rt_detr", "rt_detr_v2" or "d_fine"
    backbone: dict[str, Any] = field(default_factory=dict)
    detector: dict[str, Any] = field(default_factory=dict)


# RT-DETR sizes as transformers' conversion of the PekingU checkpoints sets them (v2 shares v1's table).
_RESNET_BASIC = {"layer_type": "basic", "hidden_sizes": [64, 128, 256, 512]}
_RTDETR_SIZES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "r18": ({**_RESNET_BASIC, "depths": [2, 2, 2, 2]}, {"hidden_expansion": 0.5, "decoder_layers": 3}),
    "r34": ({**_RESNET_BASIC, "depths": [3, 4, 6, 3]}, {"hidden_expansion": 0.5, "decoder_layers": 4}),
    "r50": ({"layer_type": "bottleneck", "depths": [3, 4, 6, 3]}, {"hidden_expansion": 1.0, "decoder_layers": 6}),
    "r101": ({"layer_type": "bottleneck", "depths": [3, 4, 23, 3]},
             {"hidden_expansion": 1.0, "decoder_layers": 6, "encoder_hidden_dim": 384, "encoder_ffn_dim": 2048}),
}
# D-FINE sizes (HGNetV2 B0/B0/B2/B4/B5 backbones) as transformers' conversion of the D-FINE checkpoints sets them.
_HGNET_STAGES = {"stage_downsample": [False, True, True, True], "stage_light_block": [False, False, True, True],
                 "stage_kernel_size": [3, 3, 5, 5]}
_HGNET_B0 = {**_HGNET_STAGES, "stem_channels": [3, 16, 16], "stage_in_channels": [16, 64, 256, 512],
             "stage_mid_channels": [16, 32, 64, 128], "stage_out_channels": [64, 256, 512, 1024],
             "stage_num_blocks": [1, 1, 2, 1], "stage_numb_of_layers": [3, 3, 3, 3],
             "use_learnable_affine_block": True}
_DFINE_SIZES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "n": ({**_HGNET_B0, "out_indices": [3, 4]},
          {"num_feature_levels": 2, "feat_strides": [16, 32], "encode_proj_layers": [1], "d_model": 128,
           "encoder_hidden_dim": 128, "encoder_ffn_dim": 512, "decoder_ffn_dim": 512, "decoder_n_points": [6, 6],
           "depth_mult": 0.5, "decoder_layers": 3, "hidden_expansion": 0.34}),
    "s": (_HGNET_B0, {"decoder_layers": 3, "hidden_expansion": 0.5, "depth_mult": 0.34,
                      "decoder_n_points": [3, 6, 3]}),
    "m": ({**_HGNET_STAGES, "stem_channels": [3, 24, 32], "stage_in_channels": [32, 96, 384, 768],
           "stage_mid_channels": [32, 64, 128, 256], "stage_out_channels": [96, 384, 768, 1536],
           "stage_num_blocks": [1, 1, 3, 1], "stage_numb_of_layers": [4, 4, 4, 4],
           "use_learnable_affine_block": True},
          {"decoder_layers": 4, "hidden_expansion": 1.0, "depth_mult": 0.67, "decoder_n_points": [3, 6, 3]}),
    "l": ({**_HGNET_STAGES, "stem_channels": [3, 32, 48], "stage_in_channels": [48, 128, 512, 1024],
           "stage_mid_channels": [48, 96, 192, 384], "stage_out_channels": [128, 512, 1024, 2048],
           "stage_num_blocks": [1, 1, 3, 1], "stage_numb_of_layers": [6, 6, 6, 6]},
          {"decoder_layers": 6, "hidden_expansion": 1.0, "encoder_ffn_dim": 1024, "decoder_n_points": [3, 6, 3]}),
    "x": ({**_HGNET_STAGES, "stem_channels": [3, 32, 64], "stage_in_channels": [64, 128, 512, 1024],
           "stage_mid_channels": [64, 128, 256, 512], "stage_out_channels": [128, 512, 1024, 2048],
           "stage_num_blocks": [1, 2, 5, 2], "stage_numb_of_layers": [6, 6, 6, 6]},
          {"decoder_layers": 6, "hidden_expansion": 1.0, "encoder_hidden_dim": 384, "encoder_ffn_dim": 2048,
           "decoder_n_points": [3, 6, 3]}),
}

#: Model name -> preset. Names follow the zoo's snake_case (rtdetr_r18, rtdetr_v2_r50, dfine_s).
PRESETS: dict[str, Preset] = {
    **{f"rtdetr_{size}": Preset("rt_detr", bb, det) for size, (bb, det) in _RTDETR_SIZES.items()},
    **{f"rtdetr_v2_{size}": Preset("rt_detr_v2", bb, det) for size, (bb, det) in _RTDETR_SIZES.items()},
    **{f"dfine_{size}": Preset("d_fine", bb, det) for size, (bb, det) in _DFINE_SIZES.items()},
}
MODELS = frozenset(PRESETS)

#: model_args Musubi applies itself: the model's input side and the detections kept per image.
OWN_MODEL_ARGS = frozenset({"image_size", "max_detections"})
#: Prefix of model_args that set a backbone config field (backbone_depths: "1,1,1,1").
BACKBONE_PREFIX = "backbone_"
#: Config fields Musubi sets itself, or that would load from the hub / change the output contract.
_RESERVED = frozenset({
    "num_labels", "id2label", "label2id", "backbone_config", "backbone", "use_timm_backbone",
    "use_pretrained_backbone", "backbone_kwargs", "use_focal_loss", "return_dict", "output_hidden_states",
    "output_attentions", "torchscript", "dtype", "torch_dtype", "architectures", "transformers_version",
    "problem_type", "is_encoder_decoder", "tie_word_embeddings", "num_channels", "out_features", "out_indices",
    "_out_features", "_out_indices", "initializer_range", "model_type",
})


def is_detr_model(name: str) -> bool:
    """True when `name` is one of the transformers DETR-family presets."""
    return name in PRESETS


def require_transformers(model: str) -> None:
    """ConfigError naming the extra when transformers or scipy (the Hungarian matcher's) is not installed."""
    if find_spec("transformers") is None or find_spec("scipy") is None:
        raise ConfigError(EXTRA_MESSAGE.format(model=model))


def preload(model: str) -> None:
    """Import the transformers classes of a preset (what building it imports first), building nothing."""
    _classes(model)


def _classes(model: str) -> tuple[type, type, type]:
    """(detector config class, backbone config class, model class) of a preset; imported on demand (heavy)."""
    require_transformers(model)
    # transformers must never reach for the hub: configs are built here, weights are local files.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    family = PRESETS[model].family
    if family == "rt_detr":
        from transformers import RTDetrConfig, RTDetrForObjectDetection, RTDetrResNetConfig

        return RTDetrConfig, RTDetrResNetConfig, RTDetrForObjectDetection
    if family == "rt_detr_v2":
        from transformers import RTDetrResNetConfig, RTDetrV2Config, RTDetrV2ForObjectDetection

        return RTDetrV2Config, RTDetrResNetConfig, RTDetrV2ForObjectDetection
    from transformers import DFineConfig, DFineForObjectDetection, HGNetV2Config

    return DFineConfig, HGNetV2Config, DFineForObjectDetection


def _fields(config_class: type) -> dict[str, Any]:
    """A config class's settable fields and their default values (less those Musubi owns)."""
    return {k: v for k, v in config_class().to_dict().items() if k not in _RESERVED}


def accepted_model_args(model: str) -> frozenset[str]:
    """model_args a DETR model takes: its config's fields, its backbone's as backbone_<field>, and Musubi's own."""
    det_cls, bb_cls, _ = _classes(model)
    return frozenset(set(_fields(det_cls)) | {BACKBONE_PREFIX + k for k in _fields(bb_cls)} | OWN_MODEL_ARGS)


def _coerce(name: str, value: Any, default: Any) -> Any:
    """A YAML scalar as the config field wants it: lists are given as comma-separated text ("1,1,1,1")."""
    if not isinstance(default, (list, tuple)) or isinstance(value, (list, tuple)):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    items = [s.strip() for s in str(value).split(",") if s.strip()]
    kind = type(default[0]) if default else int
    try:
        if kind is bool:
            return [{"true": True, "false": False}[s.lower()] for s in items]
        return [kind(s) for s in items]
    except (KeyError, ValueError):
        raise ConfigError(f"model_args.{name}: {value!r} is not a comma-separated list of {kind.__name__}; "
                          f"e.g. {','.join(str(x) for x in default)}") from None


def _out_channels(backbone: Any) -> list[int]:
    """Channels of the backbone stages the encoder reads (out_indices counts the stem as 0)."""
    stage_channels = getattr(backbone, "stage_out_channels", None) or backbone.hidden_sizes
    return [int(stage_channels[i - 1]) for i in backbone.out_indices]


def build_config(model: str, num_classes: int, model_args: dict[str, Any]) -> Any:
    """The transformers config of a preset with `model_args` applied (own args excluded); ConfigError on a bad one."""
    preset = PRESETS[model]
    det_cls, bb_cls, _ = _classes(model)
    det_fields, bb_fields = _fields(det_cls), _fields(bb_cls)
    accepted = accepted_model_args(model)
    unknown = sorted(set(model_args) - accepted)
    if unknown:
        raise ConfigError(f"model_args: {model} takes no {', '.join(unknown)}; it takes "
                          f"{', '.join(sorted(accepted))} (lists as comma-separated text)")
    backbone = dict(preset.backbone)
    detector = dict(preset.detector)
    for key, value in model_args.items():
        if key in OWN_MODEL_ARGS:
            continue
        if key in det_fields:
            detector[key] = _coerce(key, value, det_fields[key])
        else:
            name = key[len(BACKBONE_PREFIX):]
            backbone[name] = _coerce(key, value, bb_fields[name])
    backbone.setdefault("out_indices", [2, 3, 4])
    if "stage_out_channels" in bb_fields and "hidden_sizes" not in backbone:
        # HGNetV2 reports its stages' channels from hidden_sizes but builds them from stage_out_channels.
        backbone["hidden_sizes"] = backbone.get("stage_out_channels", bb_fields["stage_out_channels"])
    try:
        bb_config = bb_cls(**backbone)
        # The encoder reads the backbone's stages and the decoder the encoder's levels: derived unless given,
        # so a narrower backbone (backbone_hidden_sizes) needs no second edit.
        detector.setdefault("encoder_in_channels", _out_channels(bb_config))
        hidden = detector.get("encoder_hidden_dim", det_fields["encoder_hidden_dim"])
        detector.setdefault("decoder_in_channels", [hidden] * len(detector["encoder_in_channels"]))
        # From scratch the backbone's BatchNorm must learn its statistics (transformers freezes them for
        # fine-tuning pretrained weights); model_args.freeze_backbone_batch_norms: true restores that.
        detector.setdefault("freeze_backbone_batch_norms", False)
        return det_cls(backbone_config=bb_config, num_labels=num_classes, **detector)
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"model_args: {model} rejected them ({' '.join(str(e).split())[:200]}); "
                          "fix model_args") from None


def _own_int(model_args: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = model_args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"model_args.{key}: must be an integer >= {minimum}, not {value!r}")
    return value


class DetrDetector(nn.Module):
    """A transformers DETR-family detector with torchvision's detection interface.

    Input: a list of float images [3, H, W] in [0, 1] (transformers' RT-DETR/D-FINE processors rescale to
    [0, 1] and do not normalise), each resized to image_size x image_size. Targets: torchvision's
    {"boxes" xyxy pixels, "labels" 1..K}. Train mode returns the loss terms summed per kind (vfl, bbox,
    giou, and D-FINE's fgl, ddf, ... over the final, auxiliary and denoising layers); their sum is
    transformers' loss. Eval mode returns the top max_detections (score, class) pairs of sigmoid scores
    over queries x classes per image, boxes xyxy in that image's pixels, labels 1..K.
    """

    def __init__(self, model: nn.Module, image_size: int, max_detections: int) -> None:
        super().__init__()
        self.model = model
        self.image_size = image_size
        self.max_detections = max_detections

    @property
    def detections_per_image(self) -> int:
        """Detections eval mode returns per image: max_detections, or queries x classes if fewer."""
        config = self.model.config
        return min(self.max_detections, config.num_queries * config.num_labels)

    def _pixels(self, images: Sequence[Tensor]) -> Tensor:
        """[B, 3, S, S]: each image resized to the model's side (bilinear; skipped when it already is,
        except while tracing, so an exported graph resizes any input)."""
        size = (self.image_size, self.image_size)
        tracing = torch.jit.is_tracing()
        return torch.stack([
            im if tuple(im.shape[-2:]) == size and not tracing
            else F.interpolate(im[None], size=size, mode="bilinear", align_corners=False)[0]
            for im in images
        ])

    def forward(self, images: Sequence[Tensor], targets: Sequence[dict[str, Tensor]] | None = None) -> Any:
        pixels = self._pixels(images)
        if self.training:
            if targets is None:
                raise RuntimeError("DetrDetector: train mode needs targets (boxes, labels)")
            out = self.model(pixel_values=pixels, labels=[self._label(im, t) for im, t in zip(images, targets,
                                                                                             strict=True)])
            parts: dict[str, Tensor] = {}
            for key, value in out.loss_dict.items():
                kind = "_".join(key.split("_")[:2])  # loss_vfl_aux_0 -> loss_vfl
                parts[kind] = parts[kind] + value if kind in parts else value
            return parts
        out = self.model(pixel_values=pixels)
        return self._detections(out.logits, out.pred_boxes, images)

    @staticmethod
    def _label(image: Tensor, target: dict[str, Tensor]) -> dict[str, Tensor]:
        """transformers' label format: class_labels 0..K-1, boxes (cx, cy, w, h) normalised by the image's size."""
        h, w = image.shape[-2:]
        boxes = target["boxes"].to(torch.float32)
        scale = boxes.new_tensor([w, h, w, h])
        x0, y0, x1, y1 = (boxes / scale).unbind(-1)
        cxcywh = torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], -1)
        return {"class_labels": target["labels"].to(torch.long) - 1, "boxes": cxcywh}

    def _detections(self, logits: Tensor, boxes: Tensor, images: Sequence[Tensor]) -> list[dict[str, Tensor]]:
        """logits [B, Q, K], boxes [B, Q, 4] normalised cxcywh -> per image the top-k detections in pixels."""
        classes = logits.shape[-1]
        scores = logits.sigmoid().flatten(1)  # [B, Q*K]
        k = self.detections_per_image
        top, index = scores.topk(k, dim=1)  # [B, k]
        query = torch.div(index, classes, rounding_mode="floor")
        chosen = boxes.gather(1, query[..., None].expand(-1, -1, 4))  # [B, k, 4]
        cx, cy, bw, bh = chosen.unbind(-1)
        xyxy = torch.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], -1)
        out = []
        for i, image in enumerate(images):
            h, w = image.shape[-2:]
            # as_tensor keeps the sizes symbolic while tracing: the exported graph scales to any input size.
            # It makes them on the CPU: moved to the boxes' device (on 2x H200 the first validation failed).
            wh = torch.stack([torch.as_tensor(w), torch.as_tensor(h)]).to(device=xyxy.device, dtype=xyxy.dtype)
            scale = torch.cat([wh, wh])
            out.append({"boxes": xyxy[i] * scale, "scores": top[i], "labels": index[i] % classes + 1})
        return out


def build_detector(model: str, num_classes: int, model_args: dict[str, Any], image_size: int | None) -> DetrDetector:
    """A freshly initialised (seeded by the caller) DETR-family detector of the named preset, on the CPU."""
    side = _own_int(model_args, "image_size", image_size or DEFAULT_IMAGE_SIZE, STRIDE)
    if side % STRIDE:
        raise ConfigError(f"model {model}: image side {side} is not a multiple of {STRIDE}; set data.image_size "
                          f"or model_args.image_size to one (e.g. {max(STRIDE, side // STRIDE * STRIDE)})")
    keep = _own_int(model_args, "max_detections", DEFAULT_MAX_DETECTIONS, 1)
    config = build_config(model, num_classes, model_args)
    # The decoder's queries are picked among the encoder's feature positions: there must be enough of them.
    positions = sum((side // stride) ** 2 for stride in config.feat_strides)
    if config.num_queries > positions:
        raise ConfigError(f"model {model}: num_queries {config.num_queries} exceeds the {positions} feature positions "
                          f"of a {side}-pixel input; raise the image size or set model_args.num_queries <= {positions}")
    _, _, model_cls = _classes(model)
    try:
        hf_model = model_cls(config)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ConfigError(f"model_args: {model} cannot be built from them ({' '.join(str(e).split())[:200]}); "
                          "fix model_args") from None
    return DetrDetector(hf_model, side, keep)
