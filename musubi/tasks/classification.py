"""Built-in image classification: torchvision (or timm) models on synthetic or image-folder data."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.data import Dataset
from torchvision import transforms
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, has_file_allowed_extension

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError, one_line
from musubi.data import guards
from musubi.data import synthetic_classification as synth
from musubi.data.classify_augment import ClassifyAugment
from musubi.tasks.base import Metric, Reducer, Task, move_to
from musubi.tasks.model_check import TIMM_PREFIX, check_classifier, suggest
from musubi.tasks.pretrained import check_start_weights, load_start_weights

#: Default side of on-disk images after resizing, in pixels.
DEFAULT_IMAGE_SIZE = 224

#: ImageNet channel statistics: the usual normalisation of torchvision/timm models.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: model_args keys the task owns: classes come from the data, nothing is downloaded.
_RESERVED_ARGS = {
    "num_classes": "it comes from the data",
    "weights": "use the job's `weights:` (a file, or DEFAULT for torchvision's from the local cache)",
    "pretrained": "use the job's `weights:` (a file, or DEFAULT for torchvision's from the local cache)",
}

#: Models with auxiliary classifier heads in training mode. Their heads' loss is the original recipes' extra
#: term, which the task does not compute: the heads would get no gradient, and DDP refuses parameters that get
#: none. They are built without them (aux_logits: false) unless model_args say otherwise (refused).
AUX_HEAD_MODELS = frozenset({"googlenet", "inception_v3"})
#: Image sides offered when a model cannot take the job's: the smallest it takes above it, else the largest below.
SIZE_CANDIDATES = (32, 64, 96, 128, 160, 192, 224, 256, 299, 320, 384, 448, 512)


# -- models ----------------------------------------------------------------
def torchvision_models() -> list[str]:
    """Names of torchvision's classification models."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


def _timm() -> Any:
    try:
        import timm
    except ImportError:
        raise ConfigError("model: timm/ models need the timm package; pip install timm") from None
    return timm


def check_model_name(name: str) -> None:
    """ConfigError unless `name` is a torchvision classification model (the name table) or an installed timm one."""
    if name.startswith(TIMM_PREFIX):
        timm = _timm()
        arch = name[len(TIMM_PREFIX) :]
        if not timm.is_model(arch):
            raise ConfigError(f"model: unknown timm model {arch!r}{suggest(arch, timm.list_models())}")
        return
    check_classifier(name)


def create_model(name: str, num_classes: int, model_args: dict[str, Any]) -> nn.Module:
    """A randomly initialised classifier (weights=None: nothing is downloaded)."""
    try:
        if name.startswith(TIMM_PREFIX):
            return _timm().create_model(
                name[len(TIMM_PREFIX) :], pretrained=False, num_classes=num_classes, **model_args
            )
        return torchvision.models.get_model(name, weights=None, num_classes=num_classes, **model_args)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model_args: {name} rejects them ({one_line(e)}); fix model_args") from None


# -- data ------------------------------------------------------------------
class _FolderWithClasses(ImageFolder):
    """An ImageFolder using a given class list (the training split's), so labels agree across splits."""

    def __init__(self, root: str, classes: list[str], transform: Any = None, **guarded: Any):
        self._given = classes
        super().__init__(root, transform=transform, allow_empty=True, **guarded)

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        return self._given, {c: i for i, c in enumerate(self._given)}


def folder_classes(path: str) -> list[str]:
    """Sorted class-folder names of an image-folder root; ConfigError if there are none."""
    if not Path(path).is_dir():
        raise ConfigError(
            f"data: {path}: no such directory; give an image-folder root (one folder per class)"
        )
    try:
        return find_classes(path)[0]
    except FileNotFoundError:
        raise ConfigError(f"data: {path}: no class folders inside; expected ROOT/CLASS/image.jpg") from None


def _image_in(root: str, path: str) -> bool:
    """An image file (by extension) of the folder; ConfigError if a symlink takes it outside the folder."""
    if not has_file_allowed_extension(path, IMG_EXTENSIONS):
        return False
    guards.inside(root, path)
    return True


def image_folder(path: str, classes: list[str] | None, image_size: int,
                 max_pixels: int | None = None, raw: bool = False) -> ImageFolder:
    """An ImageFolder with deterministic resize + centre crop + normalise (no random augmentation).

    `raw`: stop before the normalisation, as uint8 [3, S, S] (a quarter of float32's bytes to the device, where
    the batch is augmented and normalised). Images are opened by `guards.open_image` (pixel limit from the
    header, one-line errors) and the scan refuses any file that a symlink takes outside `path`.
    """
    guarded = {"loader": partial(guards.open_image, max_pixels=max_pixels),
               "is_valid_file": partial(_image_in, path)}
    tail = [transforms.PILToTensor()] if raw else [transforms.ToTensor(),
                                                   transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    tf = transforms.Compose([transforms.Resize(image_size), transforms.CenterCrop(image_size), *tail])
    try:
        if classes is None:
            return ImageFolder(path, transform=tf, **guarded)
        return _FolderWithClasses(path, classes, transform=tf, **guarded)
    except FileNotFoundError as e:
        raise ConfigError(f"data: {path}: {one_line(e)}") from None


class IndexedSamples(Dataset):
    """Sample i of a data set as (image, label, i): the index seeds sample i's augmentation on the device."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Any, Any, int]:
        image, label = self.base[index]
        return image, label, index


def imagenet_normalise(images: torch.Tensor) -> torch.Tensor:
    """[B, 3, S, S] in [0, 1] -> (x - mean) / std with ImageNet's statistics (the host path's Normalize), in place.

    Scalars per channel, not a statistics tensor: a host tensor copied to a CUDA stream per batch is a copy the
    prefetch thread would queue for nothing.
    """
    for c, (m, sd) in enumerate(zip(IMAGENET_MEAN, IMAGENET_STD, strict=True)):
        images[:, c].sub_(m).div_(sd)
    return images


# -- metric ----------------------------------------------------------------
class ClassificationMetric(Metric):
    """Top-1 (and top-5) accuracy and mean loss from local sums, reduced exactly across ranks."""

    def __init__(self, num_classes: int, device: torch.device):
        self.num_classes = num_classes
        # [samples, top1 hits, top5 hits, loss sum] in float64: counts stay exact up to 2**53.
        self.state = torch.zeros(4, dtype=torch.float64, device=device)

    def update(self, outputs: torch.Tensor, batch: Any) -> None:
        """Add logits [B,K] against labels [B] (no host sync)."""
        logits = outputs.float()
        labels = batch[1].to(logits.device)
        top1 = (logits.argmax(dim=1) == labels).sum()
        k = min(5, self.num_classes)
        top5 = (logits.topk(k, dim=1).indices == labels[:, None]).any(dim=1).sum()
        loss = F.cross_entropy(logits, labels, reduction="sum")
        n = torch.tensor(labels.numel(), device=logits.device)
        self.state += torch.stack([n, top1, top5, loss]).to(self.state)

    def compute(self, reduce_sum: Reducer) -> dict[str, float]:
        """{'top1', 'top5' (K >= 5), 'val_loss'} over all ranks; NaN when no rank saw a sample."""
        n, top1, top5, loss = reduce_sum(self.state.clone()).tolist()
        if n == 0:
            nan = float("nan")
            out = {"top1": nan, "val_loss": nan}
            if self.num_classes >= 5:
                out["top5"] = nan
            return out
        out = {"top1": top1 / n, "val_loss": loss / n}
        if self.num_classes >= 5:
            out["top5"] = top5 / n
        return out


def _logits(out: Any) -> torch.Tensor:
    # GoogLeNet/Inception return a namedtuple with aux heads in training mode.
    return out.logits if hasattr(out, "logits") else out


#: BatchNorm layers, run in eval mode by the size check's meta forward (see meta_training_forward).
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def meta_training_forward(model: nn.Module, size: int) -> torch.Tensor:
    """The logits of a training forward of 2 `size`-px images through a meta-device model, its BatchNorm layers in
    eval mode meanwhile: on meta, training-mode BatchNorm runs torch's Python decomposition of the batch statistics
    (about half of the forward's CPU on BatchNorm-heavy nets), and eval mode gives the same shapes. Its one
    training-only refusal, one value per channel, cannot happen at batch 2 (BatchNorm's check is batch x H x W)."""
    norms = [m for m in model.modules() if isinstance(m, BATCH_NORMS)]
    model.train()
    for m in norms:
        m.eval()
    try:
        return _logits(model(torch.empty(2, 3, size, size)))
    finally:
        for m in norms:
            m.train()


# -- task ------------------------------------------------------------------
class ClassificationTask(Task):
    """Image classification: cross-entropy on (image [B,3,S,S], label [B]) batches."""

    primary_metric = "top1"

    def __init__(self, spec: JobSpec) -> None:
        super().__init__(spec)
        self._classes: list[str] | None = None
        self._max_pixels = spec.data.max_image_pixels
        self.device: torch.device | None = None  # the rank's device (use_device), for the feed's start line
        aug = spec.data.augment
        #: data.augment on the device batch (training only), or None.
        self.augment = ClassifyAugment(
            crop_scale=aug.crop_scale, crop_ratio=aug.crop_ratio, hflip=aug.hflip, brightness=aug.brightness or 0.0,
            contrast=aug.contrast or 0.0, saturation=aug.saturation or 0.0) if aug else None

    # -- facts from the spec ----------------------------------------------
    def model_args(self) -> dict[str, Any]:
        """model_args as passed to the constructor; vit_* default to the data's image size."""
        args = dict(self.spec.model_args)
        # torchvision ViTs fix their position embedding to image_size (224 unless told); MaxViT its input size.
        if self.spec.model.startswith("vit_"):
            args.setdefault("image_size", self.image_size())
        if self.spec.model.startswith("maxvit_"):
            args.setdefault("input_size", (self.image_size(), self.image_size()))
        if self.spec.model in AUX_HEAD_MODELS:
            args.setdefault("aux_logits", False)
        return args

    def image_size(self) -> int:
        """Side of the images the model sees, in pixels."""
        syn = self.spec.data.synthetic
        if syn is not None:
            return syn.image_size
        return self.spec.data.image_size or DEFAULT_IMAGE_SIZE

    def classes(self) -> list[str]:
        """Class-folder names of the training split (image-folder data)."""
        if self._classes is None:
            assert self.spec.data.train is not None
            self._classes = folder_classes(self.spec.data.train.path)
        return self._classes

    def class_names(self) -> list[str]:
        """Label i's name at i: the class folders (sorted, as ImageFolder numbers them); synthetic: class0..."""
        syn = self.spec.data.synthetic
        return [f"class{i}" for i in range(syn.num_classes)] if syn is not None else list(self.classes())

    def num_classes(self) -> int:
        """Number of classes, from the data."""
        syn = self.spec.data.synthetic
        return syn.num_classes if syn is not None else len(self.classes())

    # -- checks -----------------------------------------------------------
    def validate(self) -> None:
        """Model name and args, data folders and the weights file, checked before any worker starts."""
        check_model_name(self.spec.model)
        for key, why in _RESERVED_ARGS.items():
            if key in self.spec.model_args:
                raise ConfigError(f"model_args.{key}: not allowed, {why}; remove it")
        if self.spec.model in AUX_HEAD_MODELS and self.spec.model_args.get("aux_logits"):
            raise ConfigError(f"model_args.aux_logits: {self.spec.model}'s auxiliary heads would get no gradient "
                              "(the task's loss is the main head's cross-entropy), which DDP refuses; remove it")
        data = self.spec.data
        if data.synthetic is None:
            assert data.train is not None
            self.classes()  # a directory with class folders
            image_folder(data.train.path, None, self.image_size(), self._max_pixels)  # scans: fails on empty classes
            if data.val is not None:
                extra = sorted(set(folder_classes(data.val.path)) - set(self.classes()))
                if extra:
                    raise ConfigError(
                        f"data.val: {data.val.path} has classes not in data.train: {', '.join(extra[:5])}; "
                        "the splits must share class folders"
                    )
                if len(image_folder(data.val.path, self.classes(), self.image_size(), self._max_pixels)) == 0:
                    raise ConfigError(f"data.val: {data.val.path} holds no images; add some or drop data.val")
        probe = self._check_input_size()  # the model as the job builds it, on meta: built once, not again
        if probe is None:
            probe = self._meta_model()
        if self.spec.weights:
            check_start_weights(self.spec.weights, self.spec.model, probe)

    def _size_problem(self, size: int) -> tuple[str | None, nn.Module | None]:
        """(why the model cannot take `size`-px images, the model built there): built and run a training forward
        on the meta device (no memory, no compute); (None, model) when it can, (None, None) when it cannot be
        built there (RegNet: checked at build)."""
        data = self.spec.data.model_copy(update={"image_size": size, "synthetic": None})
        args = ClassificationTask(self.spec.model_copy(update={"data": data})).model_args()  # its size-given args
        try:
            with torch.device("meta"):
                model = create_model(self.spec.model, self.num_classes(), args)
                meta_training_forward(model, size)
        except NotImplementedError:
            return None, None
        except (ConfigError, RuntimeError, ValueError, AssertionError, IndexError) as e:
            # create_model's ConfigError blames model_args; the builder's own words are in its context
            return one_line(e.__context__ if isinstance(e, ConfigError) and e.__context__ is not None else e), None
        return None, model

    def _check_input_size(self) -> nn.Module | None:
        """ConfigError, before launch, for an image size the model cannot take (alexnet at 32 px, inception_v3
        under 75, maxvit_t off multiples of 224, vit_h_14 off multiples of 14), naming a size it takes; else the
        model built on the meta device at the job's size (its args are the job's), None where it was not built."""
        size = self.image_size()
        why, model = self._size_problem(size)
        if why is None:
            return model
        order = [s for s in SIZE_CANDIDATES if s > size] + [s for s in reversed(SIZE_CANDIDATES) if s < size]
        fits = next((s for s in order if self._size_problem(s)[0] is None), None)
        if fits is None:
            return None  # no size helps: not a size problem; building the model (_meta_model) says what is wrong
        where = "data.synthetic.image_size" if self.spec.data.synthetic is not None else "data.image_size"
        raise ConfigError(f"model: {self.spec.model} cannot take {size}-px images ({why}); it takes e.g. {fits} "
                          f"px: set {where}")

    def _meta_model(self) -> nn.Module | None:
        """The model built on the meta device (catches bad model_args for free), or None if it can't be."""
        try:
            with torch.device("meta"):
                return create_model(self.spec.model, self.num_classes(), self.model_args())
        except ConfigError:
            raise
        except (NotImplementedError, RuntimeError):
            return None  # some constructors (e.g. RegNet) compute on tensors: checked at build time

    # -- model and data ---------------------------------------------------
    def build_model(self) -> nn.Module:
        """A fresh classifier on the CPU, optionally loaded from the job's local weights file."""
        model = create_model(self.spec.model, self.num_classes(), self.model_args())
        if self.spec.weights:
            load_start_weights(model, self.spec.weights, self.spec.model)
        return model

    def train_dataset(self) -> Dataset:
        """Synthetic samples or the training image folder; under data.augment (image, label, index) samples, the
        images of a folder left as uint8 (train_batch augments and normalises them on the device)."""
        syn = self.spec.data.synthetic
        if syn is not None:
            ds: Dataset = synth.SyntheticClassification(
                syn.train_size, syn.image_size, syn.num_classes, syn.seed, synth.TRAIN_STREAM
            )
        else:
            assert self.spec.data.train is not None
            ds = image_folder(self.spec.data.train.path, None, self.image_size(), self._max_pixels,
                              raw=self.augment is not None)
        return ds if self.augment is None else IndexedSamples(ds)

    def val_dataset(self) -> Dataset | None:
        """Synthetic validation samples, the validation image folder, or None."""
        syn = self.spec.data.synthetic
        if syn is not None:
            if syn.val_size == 0:
                return None
            return synth.SyntheticClassification(
                syn.val_size, syn.image_size, syn.num_classes, syn.seed, synth.VAL_STREAM
            )
        if self.spec.data.val is None:
            return None
        return image_folder(self.spec.data.val.path, self.classes(), self.image_size(), self._max_pixels)

    def use_device(self, device: torch.device) -> None:
        """Remember the rank's device (the feed's start line names where the batch is augmented)."""
        self.device = torch.device(device)

    def feed_path(self) -> dict[str, str]:
        """Decode and resize in the loader workers; augmentations (if any) on the rank's device, batched."""
        path = super().feed_path()
        if self.augment is not None and self.augment.active():
            on = str(self.device) if self.device is not None else "the rank's device"
            path["augment"] = f"{', '.join(self.augment.active())} on {on}, batch (seeded per sample)"
        return path

    def to_device(self, batch: Any, device: torch.device) -> Any:
        """(images, labels) on `device`; a training batch under data.augment (uint8 images, sample indices)
        arrives as the host path would have made it: float, normalised, not augmented."""
        if len(batch) == 2:
            return move_to(batch, device)
        images, labels = self.unit_images(batch[0], device), batch[1].to(device, non_blocking=True)
        return self.finish_images(images), labels

    def train_batch(self, batch: Any, device: torch.device, epoch: int) -> Any:
        """(images, labels) on `device`, augmented per sample, seeded by (train.seed, epoch, sample index)."""
        if self.augment is None:
            return self.to_device(batch, device)
        device = torch.device(device)
        images, labels, index = batch
        keys = index.tolist()  # a host tensor: no device sync
        raw = self.unit_images(images, device)
        # Pixels from files are in [0, 1] until normalised; synthetic images are zero-centred, unbounded.
        bounds = (0.0, 1.0) if images.dtype == torch.uint8 else None
        out = self.augment(raw, keys, self.spec.train.seed, epoch, bounds)
        return self.finish_images(out), labels.to(device, non_blocking=True)

    def unit_images(self, images: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Images on `device` as float: uint8 (a folder's, under data.augment) to [0, 1], floats as they are."""
        images = images.to(device, non_blocking=True)
        return images.float().div_(255.0) if images.dtype == torch.uint8 else images

    def finish_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images as the model takes them: a folder's normalised with ImageNet's statistics (synthetic: as made)."""
        return images if self.spec.data.synthetic is not None else imagenet_normalise(images)

    def device_batch(self, batch_size: int, device: torch.device, generator: torch.Generator) -> Any:
        """Synthetic (images [B,3,S,S], labels [B]) made on `device`."""
        syn = self.spec.data.synthetic
        if syn is None:
            raise ConfigError("data.synthetic.on_device needs data.synthetic; image folders load from disk")
        return synth.device_batch(batch_size, syn.image_size, syn.num_classes, device, generator, syn.seed)

    # -- step ---------------------------------------------------------------
    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Mean cross-entropy of the logits against the labels."""
        images, labels = batch
        loss = F.cross_entropy(_logits(model(images)), labels)
        return loss, {"ce": loss.detach()}

    def predict(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Logits [B,K]."""
        return _logits(model(batch[0]))

    def metric_names(self) -> frozenset[str]:
        """ClassificationMetric's keys: top5 with five classes or more."""
        return frozenset({"top1", "val_loss", "top5"} if self.num_classes() >= 5 else {"top1", "val_loss"})

    def make_metric(self, device: torch.device) -> Metric:
        """A fresh top-1/top-5/loss accumulator."""
        return ClassificationMetric(self.num_classes(), device)
