"""Synthetic detection data: small coloured rectangles on large textured images.

Sample `i` is a pure function of (seed, stream, i): it is drawn from its own
torch.Generator, never from the global RNG, so every worker, rank and resumed
run sees the same pixels. An object's colour is a function of its class only
(the same for every seed), so the task is learnable and a model trained on one
seed transfers to another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from musubi.contract.errors import ConfigError

if TYPE_CHECKING:  # the config (pydantic) stays out of data code that runs without it (bench/, workers)
    from musubi.config.job import SyntheticSpec

#: Streams keep the train and val splits of one seed disjoint.
TRAIN_STREAM = 0
VAL_STREAM = 1

_MASK64 = (1 << 64) - 1
# Side of the coarse random colour field that is upsampled into the background texture.
_TEXTURE_GRID = 8
_NOISE_STD = 0.04
_GOLDEN = 0.6180339887498949

DetectionTarget = dict[str, Tensor]


def _splitmix64(x: int) -> int:
    """One splitmix64 step: a cheap, well-mixed 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(seed: int, stream: int, index: int) -> int:
    """The 64-bit generator seed of one sample; distinct (seed, stream, index) give unrelated streams."""
    return _splitmix64(_splitmix64(_splitmix64(seed) ^ stream) ^ index)


def class_colours(labels: Tensor) -> Tensor:
    """RGB colour in [0, 1] of each class label ([N] int -> [N, 3] float), independent of any seed."""
    # Golden-ratio hue steps keep neighbouring class ids far apart on the colour wheel.
    hue = torch.remainder(labels.to(torch.float64) * _GOLDEN, 1.0)
    sat, val = 0.85, 0.95
    # HSV -> RGB: channel n is v - v*s*clamp(min(k, 4 - k), 0, 1) with k = (n + 6h) mod 6.
    k = torch.remainder(
        torch.tensor([5.0, 3.0, 1.0], dtype=torch.float64, device=labels.device) + hue[:, None] * 6, 6
    )
    rgb = val - val * sat * torch.clamp(torch.minimum(k, 4 - k), 0, 1)
    return rgb.to(torch.float32)


def draw_detection_sample(
    image_size: int,
    num_classes: int,
    objects: int,
    min_object: int,
    max_object: int,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, DetectionTarget]:
    """One image [3, S, S] float in [0, 1] and its target {"boxes" xyxy float32 [N, 4], "labels" int64 [N]}."""
    s = image_size
    g = generator
    # Background: a low-frequency colour field (texture the detector must learn to ignore).
    coarse = torch.rand((1, 3, _TEXTURE_GRID, _TEXTURE_GRID), generator=g, device=device) * 0.4 + 0.2
    image = F.interpolate(coarse, size=(s, s), mode="bilinear", align_corners=False)[0]
    sizes = torch.randint(min_object, max_object + 1, (objects, 2), generator=g, device=device)  # (w, h)
    # Top-left corner uniform over the positions that keep the whole object inside the image.
    corner = (torch.rand((objects, 2), generator=g, device=device) * (s - sizes + 1)).floor().to(torch.int64)
    corner = torch.minimum(corner, s - sizes)
    labels = torch.randint(1, num_classes + 1, (objects,), generator=g, device=device)
    boxes = torch.cat([corner, corner + sizes], dim=1)
    colours = class_colours(labels)
    # One host sync per image (the python slice bounds); painting N boxes with masks would cost N*S*S memory.
    for (x1, y1, x2, y2), colour in zip(boxes.tolist(), colours, strict=True):
        image[:, y1:y2, x1:x2] = colour[:, None, None]
    noise = torch.randn((3, s, s), generator=g, device=device) * _NOISE_STD
    image = (image + noise).clamp_(0.0, 1.0)
    return image, {"boxes": boxes.to(torch.float32), "labels": labels.to(torch.int64)}


def check_synthetic_params(
    image_size: int, num_classes: int, objects: int, min_object: int, max_object: int
) -> None:
    """Refuse parameters that cannot give objects inside the image (ConfigError)."""
    if num_classes < 1 or objects < 1:
        raise ConfigError(f"data.synthetic: num_classes ({num_classes}) and objects ({objects}) must be >= 1")
    if not 1 <= min_object <= max_object < image_size:
        raise ConfigError(
            f"data.synthetic: need 1 <= min_object ({min_object}) <= max_object ({max_object}) "
            f"< image size ({image_size}); lower max_object or raise image_size"
        )


class SyntheticDetection(Dataset):
    """Map-style detection set; sample i -> (image [3, S, S], {"boxes", "labels", "image_id"})."""

    def __init__(
        self,
        size: int,
        image_size: int,
        num_classes: int,
        objects: int,
        min_object: int,
        max_object: int,
        seed: int = 0,
        stream: int = TRAIN_STREAM,
    ) -> None:
        check_synthetic_params(image_size, num_classes, objects, min_object, max_object)
        self.size = size
        self.image_size = image_size
        self.num_classes = num_classes
        self.objects = objects
        self.min_object = min_object
        self.max_object = max_object
        self.seed = seed
        self.stream = stream

    @classmethod
    def from_spec(cls, spec: SyntheticSpec, split: str, image_size: int | None = None) -> SyntheticDetection:
        """The train or val split described by `data.synthetic` (image side overridable by `data.image_size`)."""
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', not {split!r}")
        return cls(
            size=spec.train_size if split == "train" else spec.val_size,
            image_size=image_size or spec.image_size,
            num_classes=spec.num_classes,
            objects=spec.objects,
            min_object=spec.min_object,
            max_object=spec.max_object,
            seed=spec.seed,
            stream=TRAIN_STREAM if split == "train" else VAL_STREAM,
        )

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Tensor, DetectionTarget]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} samples")
        g = torch.Generator().manual_seed(sample_seed(self.seed, self.stream, index))
        image, target = draw_detection_sample(
            self.image_size, self.num_classes, self.objects, self.min_object, self.max_object, g
        )
        # image_id lets the mAP metric drop samples a distributed sampler repeated to even out ranks.
        target["image_id"] = torch.tensor(index, dtype=torch.int64)
        return image, target


def synthetic_detection_batch(
    batch_size: int,
    *,
    image_size: int,
    num_classes: int,
    objects: int,
    min_object: int,
    max_object: int,
    device: torch.device | str,
    generator: torch.Generator,
) -> tuple[list[Tensor], list[DetectionTarget]]:
    """A batch drawn directly on `device` (generator must live there): (images, targets) lists."""
    check_synthetic_params(image_size, num_classes, objects, min_object, max_object)
    images: list[Tensor] = []
    targets: list[DetectionTarget] = []
    for _ in range(batch_size):
        image, target = draw_detection_sample(
            image_size, num_classes, objects, min_object, max_object, generator, device
        )
        # -1: no dataset identity, so the metric never de-duplicates these.
        target["image_id"] = torch.tensor(-1, dtype=torch.int64, device=device)
        images.append(image)
        targets.append(target)
    return images, targets
