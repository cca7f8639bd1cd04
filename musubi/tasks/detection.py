"""Built-in detection task: torchvision detectors on synthetic or COCO data, scored by mAP50.

Models start from scratch (weights=None, weights_backbone=None: nothing is
downloaded), from a local state dict, or from torchvision's pretrained weights
found in the local torch hub cache (musubi.tasks.pretrained). Batches are (list of images, list of
targets): detectors take images of different sizes, so nothing is stacked.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import Dataset
from torchvision.models import detection as tvd
from torchvision.models.detection.fcos import FCOS
from torchvision.models.detection.retinanet import RetinaNet
from torchvision.models.detection.ssd import SSD
from torchvision.models.detection.transform import GeneralizedRCNNTransform

from musubi.config.job import DataSplit, JobSpec
from musubi.contract.errors import ConfigError
from musubi.data.augment import UNIT, Augment, Bounds, keep_inside
from musubi.data.coco import CocoDetection
from musubi.data.gpu_decode import DecodeStats, PackedBytes, decode_batch, pack_bytes, targets_to, unit_float
from musubi.data.gpu_tiles import TileCutter
from musubi.data.jpeg_decoder import JpegDecoder, choose
from musubi.data.sliced import EncodedTiles, FrameTile, SlicedCocoDetection, group_tiles
from musubi.data.slicing import SliceParams, sliced_predict
from musubi.data.stage_clock import StageClock, timed
from musubi.data.synthetic_detection import (
    SyntheticDetection,
    check_synthetic_params,
    synthetic_detection_batch,
)
from musubi.tasks import detr, efficientdet
from musubi.tasks.base import Metric, Reducer, Task, move_to
from musubi.tasks.coco_map import STATS, coco_map
from musubi.tasks.detection_cap import max_detections_record
from musubi.tasks.model_check import REFUSED_DETECTORS, check_detector
from musubi.tasks.pretrained import check_start_weights, load_start_weights
from musubi.tasks.stem import adapt_stem

#: Model name -> (torchvision builder, model class whose keyword arguments the builder forwards): every box
#: detector of torchvision.models.detection (tests/tasks/test_detection_builders.py builds and steps each).
MODELS: dict[str, tuple[Callable[..., nn.Module], type[nn.Module]]] = {
    "fasterrcnn_mobilenet_v3_large_fpn": (tvd.fasterrcnn_mobilenet_v3_large_fpn, tvd.FasterRCNN),
    "fasterrcnn_mobilenet_v3_large_320_fpn": (tvd.fasterrcnn_mobilenet_v3_large_320_fpn, tvd.FasterRCNN),
    "fasterrcnn_resnet50_fpn": (tvd.fasterrcnn_resnet50_fpn, tvd.FasterRCNN),
    "fasterrcnn_resnet50_fpn_v2": (tvd.fasterrcnn_resnet50_fpn_v2, tvd.FasterRCNN),
    "fcos_resnet50_fpn": (tvd.fcos_resnet50_fpn, FCOS),
    "retinanet_resnet50_fpn": (tvd.retinanet_resnet50_fpn, RetinaNet),
    "retinanet_resnet50_fpn_v2": (tvd.retinanet_resnet50_fpn_v2, RetinaNet),
    "ssd300_vgg16": (tvd.ssd300_vgg16, SSD),
    "ssdlite320_mobilenet_v3_large": (tvd.ssdlite320_mobilenet_v3_large, SSD),
}
#: torchvision detection builders that are not box detectors, and why each is refused (with the box detector
#: of the same architecture).
#: Detectors the task refuses (Mask/Keypoint R-CNN): what they train on, and the box detector to use.
REFUSED = REFUSED_DETECTORS
#: SSD resizes every image to its fixed input size (300 px for ssd300_vgg16, 320 for SSDlite) itself; these
#: GeneralizedRCNNTransform arguments are set by SSD, not by model_args.
SSD_FIXED_ARGS = frozenset({"min_size", "max_size", "fixed_size", "size_divisible"})
#: Models that resize their input between min_size and max_size (SSD has a fixed input size instead).
RESIZING_MODELS = frozenset(name for name, (_, cls) in MODELS.items() if cls is not SSD)
# Set by musubi itself, or not expressible as a YAML scalar.
_RESERVED_ARGS = frozenset(
    {
        "self",
        "args",
        "kwargs",
        "weights",
        "weights_backbone",
        "num_classes",
        "progress",
        "backbone",
        "anchor_generator",
        "size",
        "image_mean",
        "image_std",
        "norm_layer",
    }
)

#: `data.gpu_decode: auto` decodes on the device when at least this share of the files are JPEG (the rest
#: fall back to the host, image by image).
AUTO_DECODE_JPEG_SHARE = 0.5

#: model_args Musubi applies itself after building the model (torchvision's builders do not take them).
#: bn_momentum: momentum of every BatchNorm's running statistics. torchvision's SSDlite uses 0.03, tuned
#: for its 600-epoch recipe; in a run of a few hundred steps those statistics lag the weights so far
#: that evaluation (which uses them) scores mAP50 ~0 while the training loss falls. 0.1 (PyTorch's
#: default) lets them follow.
OWN_MODEL_ARGS = frozenset({"bn_momentum"})

EVAL_EXTRA_MESSAGE = "detection mAP needs the eval extra: pip install 'musubi-train[eval]'"


def known_models() -> list[str]:
    """Every built-in detection model: torchvision's, the transformers DETR-family presets, effdet's EfficientDets."""
    return [*MODELS, *detr.PRESETS, *efficientdet.PRESETS]


def accepted_model_args(model: str) -> frozenset[str]:
    """Keyword arguments a torchvision or DETR-family `model` takes from `model_args` (torchvision silently
    ignores unknown ones). An EfficientDet's are open-ended (backbone_<timm argument>): efficientdet checks them."""
    if detr.is_detr_model(model):
        return detr.accepted_model_args(model)
    builder, cls = MODELS[model]
    names: set[str] = set()
    for fn in (builder, cls.__init__, GeneralizedRCNNTransform.__init__):
        names.update(inspect.signature(fn).parameters)
    fixed = SSD_FIXED_ARGS if cls is SSD else frozenset()
    return frozenset((names - _RESERVED_ARGS - fixed) | OWN_MODEL_ARGS)


def check_detection_model(name: str) -> None:
    """ConfigError unless `name` is a built-in detector (the name table; musubi/tasks/model_check.py)."""
    check_detector(name)


def set_bn_momentum(model: nn.Module, momentum: float) -> None:
    """Set the running-statistics momentum of every BatchNorm layer of `model` (frozen ones have none)."""
    layers = [m for m in model.modules() if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d,
                                                             nn.SyncBatchNorm))]
    for layer in layers:
        layer.momentum = momentum


def map_backend() -> str:
    """The COCO-eval backend that scores mAP (coco_map): faster-coco-eval, else pycocotools; ConfigError if neither."""
    for backend, module in (("faster_coco_eval", "faster_coco_eval"), ("pycocotools", "pycocotools")):
        if find_spec(module) is not None:
            return backend
    raise ConfigError(EVAL_EXTRA_MESSAGE)


class DetectionMetric(Metric):
    """mAP50 and mAP50-95 over the whole validation set, whichever ranks hold its shards."""

    def __init__(self, device: torch.device, backend: str, max_detections: int | None = None) -> None:
        self.device = torch.device(device)
        self.backend = backend
        #: Detections per image and class that mAP scores (eval.max_detections); None: every one (coco_map).
        self.max_detections = max_detections
        # Per image, on the host: (image_id or -1, pred boxes [P,4], scores [P], labels [P], gt boxes [G,4], labels [G]).
        self._images: list[tuple[int, Tensor, Tensor, Tensor, Tensor, Tensor]] = []

    def update(self, outputs: Any, batch: Any) -> None:
        """Add one batch: `outputs` from DetectionTask.predict, `batch` = (images, targets)."""
        _, targets = batch
        for pred, target in zip(outputs, targets, strict=True):
            image_id = target.get("image_id")
            self._images.append(
                (
                    int(image_id) if image_id is not None else -1,
                    pred["boxes"].detach().float().cpu(),
                    pred["scores"].detach().float().cpu(),
                    pred["labels"].detach().cpu(),
                    target["boxes"].detach().float().cpu(),
                    target["labels"].detach().cpu(),
                )
            )

    def _tables(self) -> list[Tensor]:
        """Images [n, 3] (id, preds, gts), preds [P, 6] (xyxy, score, label), gts [G, 5] (xyxy, label); float64."""
        f64 = torch.float64
        images = torch.tensor(
            [(i, len(ps), len(gb)) for i, _, ps, _, gb, _ in self._images], dtype=f64
        ).reshape(-1, 3)
        preds = [
            torch.cat([pb.to(f64), ps[:, None].to(f64), pl[:, None].to(f64)], 1)
            for _, pb, ps, pl, _, _ in self._images
        ]
        gts = [torch.cat([gb.to(f64), gl[:, None].to(f64)], 1) for *_, gb, gl in self._images]
        return [
            images,
            torch.cat([torch.zeros(0, 6, dtype=f64), *preds]),
            torch.cat([torch.zeros(0, 5, dtype=f64), *gts]),
        ]

    def _gather(self, tables: list[Tensor], reduce_sum: Reducer) -> list[Tensor]:
        """Every rank's tables concatenated in rank order, using only the runtime's sum-all-reduce."""
        f64 = torch.float64
        world = int(reduce_sum(torch.ones(1, dtype=f64, device=self.device)).item())
        if world == 1:
            return tables
        # Querying the rank is not a collective; the collectives all go through reduce_sum.
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != world:
            raise RuntimeError(
                f"mAP gather: reduce_sum spans {world} ranks but torch.distributed's world does not"
            )
        rank = dist.get_rank()
        counts = torch.zeros((world, len(tables)), dtype=f64, device=self.device)
        counts[rank] = torch.tensor([t.shape[0] for t in tables], dtype=f64)
        counts = reduce_sum(counts).cpu().long()
        gathered = []
        for j, table in enumerate(tables):
            sizes = counts[:, j].tolist()
            total, offset = sum(sizes), sum(sizes[:rank])
            # Zeros everywhere but this rank's slot: the sum is the concatenation (exact in float64:
            # float32 boxes/scores and int labels/ids below 2**53 survive x + 0 unchanged).
            buf = torch.zeros((max(total, 1), table.shape[1]), dtype=f64, device=self.device)
            buf[offset : offset + table.shape[0]] = table.to(self.device)
            gathered.append(reduce_sum(buf)[:total].cpu())
        return gathered

    def compute(self, reduce_sum: Reducer) -> dict[str, float]:
        """Global mAP; every rank gets the same numbers (-1 where there is no ground truth, as COCO eval)."""
        images, preds, gts = self._gather(self._tables(), reduce_sum)
        pred_list: list[dict[str, Tensor]] = []
        target_list: list[dict[str, Tensor]] = []
        seen: set[int] = set()
        p = g = 0
        for image_id, n_pred, n_gt in images.long().tolist():
            pred, gt = preds[p : p + n_pred], gts[g : g + n_gt]
            p, g = p + n_pred, g + n_gt
            # A distributed sampler repeats a few samples to even out ranks; count each image once.
            if image_id >= 0:
                if image_id in seen:
                    continue
                seen.add(image_id)
            pred_list.append(
                {"boxes": pred[:, :4].float(), "scores": pred[:, 4].float(), "labels": pred[:, 5].long()}
            )
            target_list.append({"boxes": gt[:, :4].float(), "labels": gt[:, 4].long()})
        # No image: every value -1 (coco_map). Every detection the model returned is scored unless
        # eval.max_detections caps them (COCO's 100 scored a frame of 279 trees' own boxes mAP50 0.356).
        return coco_map(pred_list, target_list, self.backend, self.max_detections)


class DetectionTask(Task):
    """torchvision, transformers DETR-family or effdet detector + synthetic or COCO data + summed losses + mAP50.

    Resizing detectors (all but SSD) rescale inputs to min_size..max_size (torchvision: 800..1333);
    when the image size is known and model_args set neither, both default to it, so images are fed
    at their own resolution instead of being upsampled.
    """

    primary_metric = "map50"

    def __init__(self, spec: JobSpec) -> None:
        super().__init__(spec)
        self._train: Dataset | None = None
        self._val: Dataset | None = None
        self._val_built = False
        self._norm: tuple[float, float] | None = None
        self._frame_range: Bounds | bool = False  # frame_range(), once read
        #: The rank's device (use_device); None: not told (launcher-side checks), files decode in workers.
        self.device: torch.device | None = None
        #: Whether COCO files cross the loader as bytes and are decoded on the device (set with the train set).
        self.device_decode = False
        self.decode_stats = DecodeStats()
        #: The JPEG decoder chosen at start (data.jpeg_decoder) when the rank's device decodes; None until then.
        self.jpeg: JpegDecoder | None = None
        #: Time of the training batches' decode, convert, augment and h2d stages (feed_times).
        self.feed_clock = StageClock()
        sl = spec.data.slice
        self.cutter = TileCutter(sl.tile, self.decode_stats) if sl is not None else None
        aug = spec.data.augment
        self.augment = Augment(hflip=aug.hflip, scale=aug.scale, mosaic=aug.mosaic, brightness=aug.brightness or 0.0,
                               contrast=aug.contrast or 0.0, saturation=aug.saturation or 0.0) if aug else None

    # -- shape of the problem ----------------------------------------------
    @property
    def image_size(self) -> int | None:
        """Image side fed to the model: the slice tile, data.image_size, synthetic.image_size, or None (as on disk)."""
        data = self.spec.data
        if data.synthetic is not None:
            return data.image_size or data.synthetic.image_size
        if data.slice is not None:
            return data.slice.tile
        return data.image_size

    @property
    def slice_params(self) -> SliceParams | None:
        """data.slice as slicing parameters (None: frames are fed whole)."""
        sl = self.spec.data.slice
        return None if sl is None else SliceParams(sl.tile, sl.overlap, sl.min_visibility, sl.empty_ratio, sl.seed)

    @property
    def num_classes(self) -> int:
        """Object classes, background excluded (the model has one more output)."""
        synthetic = self.spec.data.synthetic
        if synthetic is not None:
            return synthetic.num_classes
        train = self.train_dataset()
        assert isinstance(train, (CocoDetection, SlicedCocoDetection))
        return train.num_classes

    def class_names(self) -> list[str]:
        """Label i + 1's name at i: the COCO category names (after data.classes); synthetic: class1..classK,
        as `musubi data synth` names its categories."""
        synthetic = self.spec.data.synthetic
        if synthetic is not None:
            return [f"class{c}" for c in range(1, synthetic.num_classes + 1)]
        frames = self.train_dataset()
        frames = frames.frames if isinstance(frames, SlicedCocoDetection) else frames
        assert isinstance(frames, CocoDetection)
        return [frames.category_names[c] for c in frames.category_ids]

    def category_ids(self) -> list[int]:
        """The annotation file's category id of each label 1..K (synthetic: 1..K), for COCO results."""
        synthetic = self.spec.data.synthetic
        if synthetic is not None:
            return list(range(1, synthetic.num_classes + 1))
        train = self.train_dataset()
        assert isinstance(train, (CocoDetection, SlicedCocoDetection))
        return list(train.category_ids)

    @property
    def normalization(self) -> tuple[float, float]:
        """(mean, std) of single-channel pixels: data.normalize, else the train split's statistics (computed here)."""
        norm = self.spec.data.normalize
        if norm is not None:
            return norm.mean, norm.std
        if self._norm is None:
            from musubi.data.pixels import split_pixel_stats

            train = self.spec.data.train
            assert train is not None and train.annotations is not None  # DataSpec: channels 1 reads COCO files
            _, stats = split_pixel_stats(Path(train.annotations), Path(train.path),
                                         max_pixels=self.spec.data.max_image_pixels)
            self._norm = (stats.mean, stats.std or 1.0)
        return self._norm

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the torchvision builder, model_args last (they win; Musubi's own excluded)."""
        kwargs: dict[str, Any] = {}
        if self.spec.data.channels == 1:
            # Pixels arrive standardised by the data set's statistics (to_device): the detector's own
            # ImageNet normalisation must be the identity, over 1 channel (stem) or 3 (replicate).
            width = 1 if self.spec.data.one_channel == "stem" else 3
            kwargs.update(image_mean=[0.0] * width, image_std=[1.0] * width)
        args = {k: v for k, v in self.spec.model_args.items() if k not in OWN_MODEL_ARGS}
        if (
            self.spec.model in RESIZING_MODELS
            and self.image_size is not None
            and not {"min_size", "max_size"} & set(args)
        ):
            kwargs.update(min_size=self.image_size, max_size=self.image_size)
        kwargs.update(args)
        return kwargs

    def preload(self) -> None:
        """transformers for a DETR-family model, effdet for an EfficientDet (torchvision's are imported already)."""
        if detr.is_detr_model(self.spec.model):
            detr.preload(self.spec.model)
        elif efficientdet.is_effdet_model(self.spec.model):
            efficientdet.preload()

    def validate(self) -> None:
        """Unknown model or model_args, bad synthetic sizes, missing/broken COCO files or weights -> ConfigError."""
        spec = self.spec
        self._check_model_name()
        if detr.is_detr_model(spec.model):
            detr.require_transformers(spec.model)
        if efficientdet.is_effdet_model(spec.model):
            efficientdet.require_effdet(spec.model)
            # Its backbone_<timm argument> names are open-ended: it checks them itself.
            efficientdet.check_model_args(spec.model, spec.model_args)
        else:
            accepted = accepted_model_args(spec.model)
            unknown = sorted(set(spec.model_args) - accepted)
            if unknown:
                raise ConfigError(f"model_args: {spec.model} takes no {', '.join(unknown)}; "
                                  f"it takes {', '.join(sorted(accepted))}")
        synthetic = spec.data.synthetic
        if synthetic is not None:
            check_synthetic_params(
                self.image_size or synthetic.image_size,
                synthetic.num_classes,
                synthetic.objects,
                synthetic.min_object,
                synthetic.max_object,
            )
        # Reads and checks the annotation files and images now, not in a worker.
        self.train_dataset()
        self.val_dataset()
        # Meta tensors: checks the arguments (and the weights' shapes) without allocating the model.
        with torch.device("meta"):
            meta_model = self._construct()
        if spec.weights:
            check_start_weights(spec.weights, spec.model, meta_model)
        if spec.data.channels == 1 and spec.data.one_channel == "stem":
            adapt_stem(meta_model)  # a model without an RGB convolution is refused now, not in a worker

    # -- model -------------------------------------------------------------
    def _check_model_name(self) -> None:
        check_detection_model(self.spec.model)

    def _construct(self) -> nn.Module:
        if detr.is_detr_model(self.spec.model):
            return detr.build_detector(self.spec.model, self.num_classes, dict(self.spec.model_args),
                                       self.image_size)
        momentum = self.spec.model_args.get("bn_momentum")
        if momentum is not None and (isinstance(momentum, bool) or not isinstance(momentum, (int, float))
                                     or not 0 < momentum <= 1):
            raise ConfigError(f"model_args.bn_momentum: must be a number in (0, 1], not {momentum!r}; "
                              "0.1 is PyTorch's default")
        if efficientdet.is_effdet_model(self.spec.model):
            # Single-channel frames arrive standardised by their data set's statistics (to_device).
            model = efficientdet.build_detector(self.spec.model, self.num_classes, dict(self.spec.model_args),
                                                self.image_size, normalize=self.spec.data.channels != 1)
            if momentum is not None:
                set_bn_momentum(model, float(momentum))
            return model
        builder, _ = MODELS[self.spec.model]
        try:
            model = builder(
                weights=None, weights_backbone=None, num_classes=self.num_classes + 1, **self.model_kwargs()
            )
        except (TypeError, ValueError) as e:
            raise ConfigError(f"model_args: {self.spec.model} rejected them ({e}); fix model_args") from None
        if momentum is not None:
            set_bn_momentum(model, float(momentum))
        return model

    def build_model(self) -> nn.Module:
        """A fresh detector on the CPU (num_classes + 1 outputs), loaded from spec.weights if given."""
        self._check_model_name()
        model = self._construct()
        if self.spec.weights:
            load_start_weights(model, self.spec.weights, self.spec.model)
        if self.spec.data.channels == 1 and self.spec.data.one_channel == "stem":
            adapt_stem(model)  # after the start weights: their RGB kernels are summed into the one channel
        return model

    # -- data --------------------------------------------------------------
    def _coco(self, split: DataSplit, name: str, category_ids: tuple[int, ...] | None,
              tiles: bool) -> CocoDetection | SlicedCocoDetection:
        """One COCO split: whole frames (uint8, or JPEG bytes with gpu_decode), or its tiles when `tiles`."""
        data = self.spec.data
        if split.annotations is None:
            raise ConfigError(
                f"data.{name}.annotations: detection needs a COCO annotation JSON for this split; set it"
            )
        # uint8 through the loader: 4x fewer bytes pinned and copied; to_device makes floats on the device.
        frames = CocoDetection(split.path, split.annotations, image_size=data.image_size, category_ids=category_ids,
                               as_uint8=True, max_image_pixels=data.max_image_pixels, classes=data.classes,
                               channels=data.channels)
        if name == "train":
            self.device_decode = self._decide_decode(frames)
            if self.device_decode and self.device is not None and self.jpeg is None:
                self.jpeg = choose(self.device, data.jpeg_decoder)  # once a rank: it may probe the GPU's engines
                self.decode_stats.decoder = self.jpeg.name
        frames.encoded = self.device_decode  # file bytes through the loader, decoded on the device
        params = self.slice_params
        if params is None or not tiles:
            return frames
        cache = {"on": True, "off": False}.get(data.cache, "auto")
        sliced = SlicedCocoDetection(frames, params, as_uint8=True, cache=cache)
        return sliced

    def _decide_decode(self, frames: CocoDetection) -> bool:
        """data.gpu_decode resolved: true/false as given; auto: a CUDA rank and mostly JPEG files."""
        choice = self.spec.data.gpu_decode
        if self.spec.data.channels == 1:  # single-channel PNG/TIFF, read without loss on the host
            return False
        if choice != "auto":
            return bool(choice)
        on_cuda = self.device is not None and self.device.type == "cuda"
        return on_cuda and frames.jpeg_share() >= AUTO_DECODE_JPEG_SHARE

    def use_device(self, device: torch.device) -> None:
        """Remember the rank's device (before the data sets are built): `gpu_decode: auto` decides on it."""
        if self._train is not None and torch.device(device) != self.device:
            raise RuntimeError("use_device must come before the data sets are built")
        self.device = torch.device(device)

    def feed_path(self) -> dict[str, str]:
        """Which decoder, where resize and augmentations run (the feed shows it at start)."""
        data = self.spec.data
        if data.synthetic is not None:
            return {"decode": "none (synthetic)", "resize": "loader workers", "augment": self._augment_where()}
        self.train_dataset()
        on = str(self.device) if self.device is not None else "the rank's device"
        if self.jpeg is not None:
            nv = self.jpeg.describe()
        else:
            nv = "nvJPEG" if self.device is not None and self.device.type == "cuda" else "libjpeg-turbo"
        if self.device_decode:
            decode = f"batched on {on} ({nv}; other formats on the host, counted); workers read bytes"
            if data.slice is not None and data.slice.inline_train:
                decode += "; tiles cut on the device from each frame decoded once"
        else:
            decode = "loader workers (PIL)" + ("; tiles cut in the workers" if data.slice is not None else "")
        resize = "none (as stored)" if data.image_size is None else (
            f"{on}, batch" if self.device_decode else "loader workers (PIL)")
        if self.spec.model in RESIZING_MODELS and data.image_size is None and data.slice is None \
                and "min_size" not in self.model_kwargs():
            # No size given: torchvision's transform rescales every frame to its defaults (a 256 px frame to 800 px,
            # ~10x the pixels); say so where the feed is described (issue 43), and how to keep another size.
            resize += ("; then the model rescales each frame to torchvision's 800..1333 px (set data.image_size, or "
                       "model_args min_size/max_size, to feed another size)")
        return {"decode": decode, "resize": resize, "augment": self._augment_where()}

    def _augment_where(self) -> str:
        if self.augment is None or not self.augment.active():
            return "none"
        on = str(self.device) if self.device is not None else "the rank's device"
        return f"{', '.join(self.augment.active())} on {on}, batch (seeded per sample)"

    def feed_counts(self) -> dict[str, Any]:
        """Images decoded on the device and on the host (and why), when the device decodes."""
        return {"decoded": self.decode_stats.record()} if self.device_decode else {}

    def feed_times(self) -> dict[str, dict[str, float]]:
        """Per-batch time of the training batches' decode, convert, augment and h2d stages."""
        return self.feed_clock.record()

    def train_dataset(self) -> Dataset:
        """Synthetic train split or the COCO data.train split (built once, then cached)."""
        if self._train is None:
            data = self.spec.data
            if data.synthetic is not None:
                self._train = SyntheticDetection.from_spec(data.synthetic, "train", self.image_size)
            else:
                assert data.train is not None  # DataSpec guarantees one source
                # slice.inline_train false: the train split is already tiles (`musubi data slice`).
                self._train = self._coco(data.train, "train", None,
                                         tiles=data.slice is None or data.slice.inline_train)
        return self._train

    def val_dataset(self) -> Dataset | None:
        """Synthetic val split (None if val_size is 0) or COCO data.val with the train split's label map."""
        if not self._val_built:
            data = self.spec.data
            if data.synthetic is not None:
                if data.synthetic.val_size > 0:
                    self._val = SyntheticDetection.from_spec(data.synthetic, "val", self.image_size)
            elif data.val is not None:
                train = self.train_dataset()
                assert isinstance(train, (CocoDetection, SlicedCocoDetection))
                # Sliced eval scores whole frames (tiles predicted and merged in predict).
                whole = data.slice is not None and data.slice.sliced_eval
                self._val = self._coco(data.val, "val", train.category_ids, tiles=not whole)
            self._val_built = True
        return self._val

    def collate(self, samples: list[Any]) -> tuple[Any, list[dict[str, Tensor]]]:
        """Samples -> (images, targets) lists; not stacked, detectors take images of any size.

        Tiles still in their encoded frames become one EncodedTiles (each frame's bytes once per batch), file
        bytes one PackedBytes.
        """
        images = [s[0] for s in samples]
        if images and isinstance(images[0], FrameTile):
            return group_tiles(images), [s[1] for s in samples]
        if images and images[0].dim() == 1:  # file bytes (device decode): one tensor crosses from the worker
            return pack_bytes(images), [s[1] for s in samples]
        return images, [s[1] for s in samples]

    def batch_size_of(self, batch: Any) -> int:
        """Images in the batch."""
        return len(batch[1])

    def to_device(self, batch: Any, device: torch.device) -> Any:
        """Images to the device as float [3, H, W] in [0, 1] (uint8 converted there, file bytes decoded there)."""
        return self._on_device(batch, torch.device(device), None, move_targets=True)

    def _on_device(self, batch: Any, device: torch.device, clock: StageClock | None, move_targets: bool) -> Any:
        """to_device, timed by `clock`; `move_targets=False` keeps the targets on the host (augment reads them)."""
        images, targets = batch
        if isinstance(images, EncodedTiles):
            assert self.cutter is not None
            with timed(clock, "decode", device):  # the batch's new frames, and the tiles cut from them
                tiles = self.cutter.cut(images, device, self.jpeg)
            with timed(clock, "convert", device):
                tiles = unit_float(tiles)
            if not move_targets:
                return tiles, targets
            with timed(clock, "h2d", device):
                return tiles, targets_to(targets, device)
        if isinstance(images, PackedBytes):  # file bytes (device decode)
            return decode_batch(images.unpack(), targets, device, self.spec.data.image_size, self.decode_stats, clock,
                                move_targets, self.jpeg)
        with timed(clock, "h2d", device):
            images = [im.to(device, non_blocking=True) for im in images]
        if self.spec.data.channels == 1:
            # [1, H, W] in stored units (counts, centikelvin) as float32, exact for 8- and 16-bit values.
            images = [im.float() for im in images]
            if not move_targets:
                return images, targets  # train_batch augments them in stored units, then standardises
            return self.standardise(images), move_to(targets, device)
        with timed(clock, "convert", device):
            images = unit_float(images) if images and images[0].dtype == torch.uint8 else images
        if not move_targets:
            return images, targets
        return images, targets_to(targets, device) if targets and isinstance(targets[0], dict) else move_to(
            targets, device)

    def frame_range(self) -> Bounds:
        """The pixel range single-channel frames keep when augmented: their stored type's, read once from the
        train split's headers (None for signed and float frames)."""
        if self._frame_range is False:
            train = self.train_dataset()
            self._frame_range = train.stored_range() if isinstance(train, CocoDetection) else None
        return self._frame_range

    def standardise(self, images: list[Tensor]) -> list[Tensor]:
        """Single-channel frames (float, stored units) -> (x - mean) / std by the data set's statistics, in place;
        copied to 3 channels under one_channel: replicate."""
        mean, std = self.normalization
        images = [im.sub_(mean).div_(std) for im in images]
        if self.spec.data.one_channel == "replicate":
            images = [im.expand(3, -1, -1) for im in images]
        return images

    def train_batch(self, batch: Any, device: torch.device, epoch: int) -> Any:
        """to_device, then data.augment on the device batch, seeded per sample by (train.seed, epoch, image_id).

        The targets stay on the host until the images are augmented: box arithmetic on a CUDA stream would
        make the prefetch thread wait for the stream at every small tensor and boolean index.
        """
        device, clock = torch.device(device), self.feed_clock
        if self.augment is None:
            return self._on_device(batch, device, clock, move_targets=True)
        keys = [int(t["image_id"]) for t in batch[1]]  # read on the host: no device sync
        one = self.spec.data.channels == 1
        # Single-channel frames keep their stored type's range (16-bit counts saturate at 65535), not [0, 1].
        bounds = self.frame_range() if one else UNIT
        images, targets = self._on_device(batch, device, clock, move_targets=False)
        with timed(clock, "augment", device):
            images, targets = self.augment(images, targets, keys, self.spec.train.seed, epoch, bounds)
            targets = [keep_inside(img, t) for img, t in zip(images, targets, strict=True)]
            if one:
                images = self.standardise(images)
        with timed(clock, "h2d", device):
            return images, targets_to(targets, device)

    def device_batch(self, batch_size: int, device: torch.device, generator: torch.Generator) -> Any:
        """A synthetic (images, targets) batch drawn on `device` with `generator`."""
        synthetic = self.spec.data.synthetic
        if synthetic is None:
            raise ConfigError(
                "data.synthetic.on_device needs data.synthetic; COCO data comes from the loader"
            )
        return synthetic_detection_batch(
            batch_size,
            image_size=self.image_size or synthetic.image_size,
            num_classes=synthetic.num_classes,
            objects=synthetic.objects,
            min_object=synthetic.min_object,
            max_object=synthetic.max_object,
            device=device,
            generator=generator,
        )

    # -- step --------------------------------------------------------------
    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """Sum of the detector's losses (model in train mode) and each part, detached."""
        images, targets = batch
        losses = model(images, targets)
        if not isinstance(losses, dict):
            raise RuntimeError(
                "detection loss needs the model in train mode (in eval mode it returns detections)"
            )
        total = sum(losses.values())
        assert isinstance(total, Tensor)
        return total, {name: value.detach() for name, value in losses.items()}

    def predict(self, model: nn.Module, batch: Any) -> list[dict[str, Tensor]]:
        """Detections per image: {"boxes" xyxy, "scores", "labels"} in input-image pixels."""
        images, _ = batch
        sl = self.spec.data.slice
        if sl is None or not sl.sliced_eval or self.spec.data.synthetic is not None:
            return model(images)
        # Whole validation frames: predict on their tiles, merge in frame pixels, so mAP is per frame.
        return [sliced_predict(model, image, sl.tile, sl.overlap, batch=max(1, len(images)), iou=sl.nms_iou,
                               merge=sl.merge, match_metric=sl.match_metric)
                for image in images]

    def metric_names(self) -> frozenset[str]:
        """coco_map's keys (DetectionMetric)."""
        return frozenset(STATS)

    def make_metric(self, device: torch.device) -> Metric:
        """A fresh mAP accumulator (ConfigError if the eval extra is not installed)."""
        return DetectionMetric(device, map_backend(), self.spec.eval.max_detections)

    def eval_notes(self, model: nn.Module) -> dict[str, Any]:
        """eval.json's "max_detections": the model's cap and the metric's, and a warning when a validation frame
        holds more objects than either keeps (then mAP cannot reach 1)."""
        val = self.val_dataset()
        synthetic = self.spec.data.synthetic
        # Whole frames (and sliced eval's) know their boxes; tiles scored as tiles are not counted here.
        most = val.most_boxes() if isinstance(val, CocoDetection) else (
            synthetic.objects if synthetic is not None and val is not None else None)
        return {"max_detections": max_detections_record(model, self.spec.eval.max_detections, most)}
