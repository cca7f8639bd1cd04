"""Synthetic image classification: class-dependent colour + stripe patterns under noise.

Every class owns a fixed pattern (a mean colour and a sinusoidal stripe of its
own frequency and phase) drawn from the data seed; a sample is its class's
pattern plus Gaussian noise drawn from (seed, split, index). A model can learn
the classes, and a sample is a pure function of its index (exact resume).
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

#: Streams keep the class table, the training set and the validation set independent.
CLASS_STREAM = 0
TRAIN_STREAM = 1
VAL_STREAM = 2

#: Per-pixel noise std; the class signal has amplitude ~0.6 per component.
NOISE_STD = 0.5

_MASK64 = (1 << 64) - 1


def sample_seed(seed: int, stream: int, index: int) -> int:
    """A well-mixed 63-bit seed for one sample (splitmix64 of seed, stream and index)."""
    x = (seed * 0x9E3779B97F4A7C15 + stream * 0xBF58476D1CE4E5B9 + index) & _MASK64
    # splitmix64 finaliser: neighbouring indices get unrelated seeds.
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return x >> 1  # torch.Generator.manual_seed takes it on every platform


def class_table(num_classes: int, seed: int) -> torch.Tensor:
    """Per-class pattern parameters [K, 6]: colour r,g,b in [-1,1], stripe fx, fy in [0.5,4), phase."""
    g = torch.Generator().manual_seed(sample_seed(seed, CLASS_STREAM, 0))
    u = torch.rand(num_classes, 6, generator=g)
    colour = u[:, :3] * 2 - 1
    freq = 0.5 + 3.5 * u[:, 3:5]
    phase = u[:, 5:6] * (2 * math.pi)
    return torch.cat([colour, freq, phase], dim=1)


def render(params: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Images [B,3,S,S] from class parameters [B,6] and noise [B,3,S,S] (same device)."""
    size = noise.shape[-1]
    coord = torch.arange(size, device=noise.device, dtype=noise.dtype) / size  # [S]
    fx, fy, phase = (params[:, i, None, None] for i in (3, 4, 5))  # each [B,1,1]
    # [B,S,S]: rows vary with fy, columns with fx.
    stripe = torch.sin(2 * math.pi * (fx * coord[None, None, :] + fy * coord[None, :, None]) + phase)
    colour = params[:, :3, None, None]  # [B,3,1,1]
    return 0.6 * colour + 0.6 * stripe[:, None] + NOISE_STD * noise


class SyntheticClassification(Dataset):
    """Map-style dataset: sample i is (image [3,S,S] float32, label = i % num_classes)."""

    def __init__(
        self, size: int, image_size: int, num_classes: int, seed: int = 0, stream: int = TRAIN_STREAM
    ):
        self.size = size
        self.image_size = image_size
        self.num_classes = num_classes
        self.seed = seed
        self.stream = stream
        self.table = class_table(num_classes, seed)  # [K,6], shared by train and val

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} samples")
        # A local generator: never the global RNG, so loader workers and resume agree.
        g = torch.Generator().manual_seed(sample_seed(self.seed, self.stream, index))
        s = self.image_size
        noise = torch.randn(1, 3, s, s, generator=g)
        label = index % self.num_classes
        image = render(self.table[label : label + 1], noise)[0]
        return image, label


def device_batch(
    batch_size: int,
    image_size: int,
    num_classes: int,
    device: torch.device,
    generator: torch.Generator,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(images [B,3,S,S], labels [B]) generated on `device`; `generator` must live on that device."""
    table = class_table(num_classes, seed).to(device)
    labels = torch.randint(num_classes, (batch_size,), device=device, generator=generator)
    noise = torch.randn(batch_size, 3, image_size, image_size, device=device, generator=generator)
    return render(table[labels], noise), labels
