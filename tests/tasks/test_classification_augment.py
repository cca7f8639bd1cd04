"""A classifier's data.augment: the device path equals the host path when nothing is drawn, and each training
sample's augmentation is a function of (train.seed, epoch, its index) on image folders and synthetic data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torch.utils.data import default_collate

from musubi.config.load import job_from_dict
from musubi.tasks.classification import ClassificationTask, image_folder


def folder(root: Path, per_class: int = 3, side: int = 20) -> Path:
    """An image folder of two classes of small RGB PNGs (random pixels, a fixed seed)."""
    g = torch.Generator().manual_seed(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            px = (torch.rand(side, side + 4, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(px).save(root / c / f"{i}.png")
    return root


def task_of(data: dict[str, Any], augment: dict[str, Any] | None) -> ClassificationTask:
    if augment is not None:
        data = {**data, "augment": augment}
    spec = job_from_dict({"name": "c", "task": "classification", "model": "resnet18", "data": data,
                          "train": {"seed": 5}}, source="job.yaml")
    return ClassificationTask(spec)


def batch_of(task: ClassificationTask, indices: list[int]) -> Any:
    ds = task.train_dataset()
    return task.collate([ds[i] for i in indices])


def test_with_nothing_drawn_the_device_path_equals_the_host_path(tmp_path: Path) -> None:
    data = {"train": {"path": str(folder(tmp_path / "f"))}, "image_size": 16}
    plain = task_of(data, None)
    off = task_of(data, {"crop_scale": None, "hflip": 0.0, "brightness": 0, "contrast": 0, "saturation": 0})
    cpu = torch.device("cpu")
    host_images, host_labels = plain.train_batch(batch_of(plain, [0, 3, 5]), cpu, 0)
    raw = batch_of(off, [0, 3, 5])
    assert raw[0].dtype == torch.uint8 and raw[2].tolist() == [0, 3, 5]  # uint8 and the indices cross the loader
    images, labels = off.train_batch(raw, cpu, 0)
    assert images.dtype == torch.float32 and torch.equal(labels, host_labels)
    torch.testing.assert_close(images, host_images, rtol=0, atol=1e-5)  # ToTensor + Normalize, on the device
    # to_device (validation-style consumers: autobatch, predictions) gives the same unaugmented batch
    torch.testing.assert_close(off.to_device(raw, cpu)[0], host_images, rtol=0, atol=1e-5)
    # validation never sees the augmentation: its folder is the host path's
    assert image_folder(data["train"]["path"], None, 16)[0][0].dtype == torch.float32


@pytest.mark.parametrize("source", ["folder", "synthetic"])
def test_a_sample_is_augmented_by_seed_epoch_and_index_wherever_it_lands(tmp_path: Path, source: str) -> None:
    data = ({"train": {"path": str(folder(tmp_path / "f"))}, "image_size": 16} if source == "folder"
            else {"synthetic": {"train_size": 12, "val_size": 4, "image_size": 16, "num_classes": 3}})
    task = task_of(data, {})  # the task's default recipe
    aug = task.spec.data.augment
    assert aug is not None and aug.crop_scale == (0.08, 1.0) and (aug.brightness, aug.contrast, aug.saturation) == (
        0.4, 0.4, 0.4)
    cpu = torch.device("cpu")
    a, la = task.train_batch(batch_of(task, [0, 1, 2, 5]), cpu, 3)
    b, lb = task.train_batch(batch_of(task, [5, 2, 4, 0]), cpu, 3)
    assert torch.equal(la[[0, 2, 3]], lb[[3, 1, 0]])
    torch.testing.assert_close(a[[0, 2, 3]], b[[3, 1, 0]])  # same sample, same augmentation, other batch
    c, _ = task.train_batch(batch_of(task, [0, 1, 2, 5]), cpu, 4)
    assert not torch.allclose(a, c)  # another epoch, other draws
    plain, _ = task.to_device(batch_of(task, [0, 1, 2, 5]), cpu)
    assert not torch.allclose(a, plain) and a.shape == plain.shape
    if source == "synthetic":  # zero-centred values: colour jitter scales them, nothing clamps them to [0, 1]
        assert float(a.min()) < 0
    assert task.feed_path()["augment"] == "crop, hflip, colour on the rank's device, batch (seeded per sample)"


def test_collate_of_an_augmented_set_keeps_index_order() -> None:
    task = task_of({"synthetic": {"train_size": 8, "val_size": 2, "image_size": 16, "num_classes": 2}},
                   {"crop_scale": [0.5, 1.0]})
    ds = task.train_dataset()
    images, labels, index = default_collate([ds[i] for i in (6, 1)])
    assert index.tolist() == [6, 1] and labels.tolist() == [0, 1] and images.shape == (2, 3, 16, 16)
