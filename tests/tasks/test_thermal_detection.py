"""Thermal detection: the job options, the 1-channel stem, and a 2-rank run whose loss falls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
import yaml

from musubi.config.load import job_from_dict
from musubi.contract.errors import ConfigError
from musubi.data.augment import Augment
from musubi.data.synthetic_files import SyntheticFiles, write_synthetic_coco
from musubi.tasks.detection import DetectionTask
from musubi.tasks.stem import adapt_stem
from tests.support.runs import train

DETECTOR = "fasterrcnn_mobilenet_v3_large_320_fpn"


def _job(data: dict[str, Any], task: str = "detection") -> dict[str, Any]:
    return {"name": "t", "task": task, "model": DETECTOR, "data": data}


FILES = {"train": {"path": "x/images", "annotations": "x/a.json"}}


@pytest.mark.parametrize(("data", "task", "says"), [
    ({**FILES, "channels": 2}, "detection", "data.channels: Input should be 1 or 3 (got 2)"),
    ({**FILES, "channels": 1, "one_channel": "copy"}, "detection", "data.one_channel: Input should be 'stem' or "
                                                                   "'replicate'"),
    ({"synthetic": {}, "channels": 1}, "detection", "synthetic data is RGB: write a thermal set"),
    ({**FILES, "normalize": {"mean": 1.0, "std": 2.0}}, "detection", "set channels: 1 or remove them"),
    ({**FILES, "channels": 1, "normalize": {"mean": 1.0, "std": 0}}, "detection", "data.normalize.std: Input should "
                                                                                   "be greater than 0"),
    ({**FILES, "channels": 1, "slice": {"tile": 64}}, "detection", "set slice.inline_train: false"),
    ({**FILES, "channels": 1}, "classification", "task classification reads RGB"),
])
def test_bad_channel_options_are_one_line_errors(data: dict, task: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        job_from_dict(_job(data, task), source="job.yaml")
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("build", [lambda: torchvision.models.resnet18(num_classes=4),
                                   lambda: torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
                                       weights=None, weights_backbone=None, num_classes=3).backbone])
def test_stem_on_grey_equals_rgb_model_on_replicated_grey(build: Any) -> None:
    torch.manual_seed(0)
    model = build().eval()
    grey = torch.rand(2, 1, 64, 64)
    with torch.no_grad():
        rgb_out = model(grey.expand(-1, 3, -1, -1))
        name = adapt_stem(model)
        one_out = model(grey)
    assert name in ("conv1", "body.0.0")
    torch.testing.assert_close(_flat(one_out), _flat(rgb_out), rtol=1e-4, atol=1e-5)


def _flat(out: Any) -> torch.Tensor:
    """A classifier's logits, or a backbone's feature maps (an OrderedDict) as one vector."""
    return torch.cat([v.flatten() for v in out.values()]) if isinstance(out, dict) else out


def test_augment_on_16_bit_frames_works_in_stored_units_then_standardises(tmp_path: Path) -> None:
    """data.augment on channels 1: the frames are flipped, scaled and jittered as 16-bit counts (their range kept,
    not [0, 1]), then standardised; each sample's draw is a function of (seed, epoch, image id)."""
    ann = write_synthetic_coco(tmp_path / "set", SyntheticFiles(
        images=4, width=48, height=40, num_classes=2, objects=2, min_object=10, max_object=20, thermal=True),
        workers=1)
    data = {"train": {"path": str(ann.parent / "images"), "annotations": str(ann)}, "channels": 1,
            "normalize": {"mean": 29_500.0, "std": 400.0}}
    plain = DetectionTask(job_from_dict(_job(data), source="job.yaml"))
    augmented = DetectionTask(job_from_dict(_job({**data, "augment": {
        "hflip": 1.0, "scale": [0.5, 0.5], "brightness": 0.01, "contrast": 0.2}}), source="job.yaml"))
    assert augmented.spec.data.augment.saturation == 0.0  # detection's default: off
    ds = plain.train_dataset()
    assert ds.stored_range() == (0.0, 65535.0) and augmented.frame_range() == (0.0, 65535.0)  # 16-bit PNG
    cpu = torch.device("cpu")
    ref, ref_t = plain.train_batch(plain.collate([ds[i] for i in range(4)]), cpu, 0)
    out, out_t = augmented.train_batch(augmented.collate([augmented.train_dataset()[i] for i in range(4)]), cpu, 0)
    for r, o, rt, ot in zip(ref, out, ref_t, out_t, strict=True):
        assert o.shape == (1, r.shape[1] // 2, r.shape[2] // 2)  # scale 0.5 in stored units
        assert o.dtype == torch.float32 and torch.isfinite(o).all()
        # standardised counts, not [0, 1] pixels: the brightness gain moved the mean by at most 1 % of ~29,500
        assert abs(float(o.mean()) - float(r.mean())) < 0.015 * 29_500 / 400 + 1.0
        assert float(o.std()) > 0.5 * float(r.std())
        # boxes halved and mirrored (hflip 1.0): x1' = W' - x2 / 2
        w = o.shape[2]
        torch.testing.assert_close(ot["boxes"][:, 0], w - rt["boxes"][:, 2] / 2, atol=0.6, rtol=0)
    again, _ = augmented.train_batch(augmented.collate([augmented.train_dataset()[i] for i in range(4)]), cpu, 0)
    assert all(torch.equal(a, b) for a, b in zip(out, again, strict=True))
    other, _ = augmented.train_batch(augmented.collate([augmented.train_dataset()[i] for i in range(4)]), cpu, 1)
    assert not all(torch.equal(a, b) for a, b in zip(out, other, strict=True))
    assert "colour" in augmented.feed_path()["augment"]


def test_single_channel_counts_keep_their_range_in_every_augmentation() -> None:
    """16-bit counts near the top of their range: scale, mosaic and a brightness gain clamp at 65535, not 1."""
    img = torch.full((1, 32, 32), 60_000.0)
    boxes = torch.tensor([[4.0, 4.0, 20.0, 20.0]])
    aug = Augment(hflip=0.5, scale=(0.7, 1.3), mosaic=1.0, brightness=0.3)
    keys = list(range(8))
    out, _ = aug([img] * 8, [{"boxes": boxes, "labels": torch.tensor([1])}] * 8, keys, 0, 0, (0.0, 65535.0))
    gains = [aug.draw(0, 0, k).brightness for k in keys]
    assert min(gains) < 1.0 < 1.09 < max(gains)  # these draws both darken and saturate
    for o, gain in zip(out, gains, strict=True):  # a flat frame stays flat through mosaic and scale
        assert o.shape[0] == 1 and torch.allclose(o, torch.full_like(o, min(65_535.0, 60_000.0 * gain)))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_channel_detector_learns_on_two_ranks(tmp_path: Path) -> None:
    """16-bit thermal frames, 1-channel stem, augmented (flip, gain, contrast), 2 gloo ranks: the loss falls;
    job.json records the statistics."""
    ann = write_synthetic_coco(tmp_path / "set", SyntheticFiles(
        images=8, width=96, height=96, num_classes=2, objects=3, min_object=20, max_object=40, thermal=True),
        workers=1)
    job = {
        "name": "thermal", "task": "detection", "model": DETECTOR,
        "model_args": {"min_size": 96, "max_size": 96},
        "data": {"train": {"path": str(ann.parent / "images"), "annotations": str(ann)}, "channels": 1,
                 "workers": 0, "augment": {"hflip": 0.5, "brightness": 0.01, "contrast": 0.1}},
        "train": {"epochs": 4, "batch": 2, "lr": 0.02, "lr_rule": "none", "schedule": "constant", "log_every": 1,
                  "seed": 1},
        "checkpoint": {"enabled": False}, "telemetry": {"enabled": False},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    code, out = train(str(path), "--nproc", "2", "--out", str(tmp_path / "run"), "--no-check")
    assert code == 0, out[-3000:]
    job_dir = tmp_path / "run" / "thermal"
    assert "augment hflip, colour on cpu, batch (seeded per sample)" in (job_dir / "logs" / "rank0.log").read_text()
    losses = [r["loss"] for r in map(json.loads, (job_dir / "metrics.jsonl").read_text().splitlines())
              if r.get("kind") == "train"]
    assert len(losses) == 8
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    normalize = json.loads((job_dir / "job.json").read_text())["config"]["data"]["normalize"]
    assert normalize["mean"] > 29_000 and normalize["std"] > 100 and "uint16" in normalize["source"]
