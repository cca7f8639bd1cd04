"""Thermal infrared: single-channel frames read without loss, their statistics, and check/slice/convert on them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from musubi.cli import app
from musubi.contract.errors import ConfigError
from musubi.data.coco import CocoDetection
from musubi.data.pixels import pixel_stats, split_pixel_stats
from musubi.data.single_channel import read_single_channel
from musubi.data.synthetic_files import SyntheticFiles, write_synthetic_coco


def _thermal(root: Path, image_format: str = "png", bits: int = 16, images: int = 3) -> Path:
    p = SyntheticFiles(images=images, width=150, height=100, num_classes=2, objects=3, min_object=10, max_object=30,
                       thermal=True, bits=bits, image_format=image_format)
    return write_synthetic_coco(root, p, workers=1)


@pytest.mark.parametrize("mode", ["png16", "tiff16", "tiff16-lzw", "tiff16-big-endian", "png8", "tiff-float"])
def test_single_channel_frames_read_bit_exact(tmp_path: Path, mode: str) -> None:
    # Values over 255 (and, for float, fractions): an 8-bit RGB decode, what training did before, cannot equal them.
    base = (np.arange(40 * 30, dtype=np.uint32).reshape(30, 40) * 53 % 65536)
    path = tmp_path / f"f.{'png' if mode.startswith('png') else 'tif'}"
    if mode == "png8":
        pixels = (base % 256).astype(np.uint8)
        Image.fromarray(pixels).save(path)
    elif mode == "tiff-float":
        pixels = (base.astype(np.float32) / 100 + 273.15).astype(np.float32)
        Image.fromarray(pixels).save(path)
    elif mode == "tiff16-big-endian":
        pixels = base.astype(np.uint16)
        Image.frombytes("I;16B", (40, 30), pixels.astype(">u2").tobytes()).save(path)
    else:
        pixels = base.astype(np.uint16)
        Image.fromarray(pixels).save(path, **({"compression": "tiff_lzw"} if mode.endswith("lzw") else {}))
    got = read_single_channel(path)
    assert got.dtype == pixels.dtype.newbyteorder("=") and np.array_equal(got, pixels)


def test_rgb_frame_is_refused_in_one_line(tmp_path: Path) -> None:
    Image.new("RGB", (8, 8)).save(tmp_path / "c.png")
    with pytest.raises(ConfigError, match=r"c.png: image mode RGB \(3 channels\), not single-channel; set "
                                          r"data.channels: 3") as e:
        read_single_channel(tmp_path / "c.png")
    assert "\n" not in str(e.value)


def test_statistics_exact_and_kept_per_version(tmp_path: Path) -> None:
    ann = _thermal(tmp_path / "set")
    images = ann.parent / "images"
    frames = [np.asarray(Image.open(p), dtype=np.float64) for p in sorted(images.iterdir())]
    every = np.concatenate([f.ravel() for f in frames])
    stats = pixel_stats(sorted(images.iterdir()))
    assert stats.dtype == "uint16" and stats.pixels == every.size
    assert stats.mean == pytest.approx(every.mean(), rel=1e-12) and stats.std == pytest.approx(every.std(), rel=1e-9)
    assert (stats.min, stats.max) == (every.min(), every.max()) and stats.max > 29_315  # centikelvin, over 20 C
    db = tmp_path / "musubi.db"
    version, first = split_pixel_stats(ann, images, db)
    assert first == stats
    # Recorded by version: a changed frame is a new version with new statistics, the old entry stays valid.
    pixels = np.asarray(Image.open(images / "frame_00000.png")).copy()
    pixels[0, 0] = 65535
    Image.fromarray(pixels).save(images / "frame_00000.png")
    version2, changed = split_pixel_stats(ann, images, db)
    assert version2 != version and changed.max == 65535


def test_coco_reads_thermal_frames_in_stored_units(tmp_path: Path) -> None:
    ann = _thermal(tmp_path / "set", "tiff")
    ds = CocoDetection(ann.parent / "images", ann, channels=1, as_uint8=True)
    image, target = ds[1]
    stored = np.asarray(Image.open(ann.parent / "images" / "frame_00001.tif"))
    assert image.dtype == torch.float32 and image.shape == (1, 100, 150)
    assert torch.equal(image[0], torch.from_numpy(stored.astype(np.float32)))
    assert len(target["boxes"]) == 3


def test_sixteen_bit_set_round_trips_check_slice_convert(tmp_path: Path) -> None:
    """check passes and reports the statistics; slice and convert leave every pixel value as it was."""
    run = CliRunner()
    ann = _thermal(tmp_path / "set", "tiff")
    frames = {p.name: np.asarray(Image.open(p)) for p in (ann.parent / "images").iterdir()}
    res = run.invoke(app, ["data", "check", str(ann), "--json", "--store", str(tmp_path)])
    assert res.exit_code == 0, res.output
    pixels = json.loads(res.output)["pixels"]
    assert pixels["dtype"] == "uint16" and pixels["images"] == 3
    # slice: every tile is the frame's crop, 16-bit, zero padded right and below.
    res = run.invoke(app, ["data", "slice", str(ann), "--tile", "64", "--overlap", "0.25", "--empty-ratio", "1",
                           "--out", str(tmp_path / "tiles")])
    assert res.exit_code == 0, res.output
    tiles = json.loads((tmp_path / "tiles" / "annotations.json").read_text())
    by_id = {i["id"]: i for i in json.loads(ann.read_text())["images"]}
    for img in tiles["images"]:
        tile = Image.open(tmp_path / "tiles" / "images" / img["file_name"])
        assert tile.mode == "I;16"
        frame = frames[by_id[img["frame_id"]]["file_name"]]
        x0, y0 = img["window"][:2]
        want = np.zeros((64, 64), np.uint16)
        crop = frame[y0 : y0 + 64, x0 : x0 + 64]
        want[: crop.shape[0], : crop.shape[1]] = crop
        assert np.array_equal(np.asarray(tile), want), img["file_name"]
    # convert to YOLO and back: the same bytes, so the same values.
    res = run.invoke(app, ["data", "convert", str(ann), "--to", "yolo", "--out", str(tmp_path / "yolo")])
    assert res.exit_code == 0, res.output
    res = run.invoke(app, ["data", "convert", str(tmp_path / "yolo"), "--to", "coco", "--out",
                           str(tmp_path / "back.json")])
    assert res.exit_code == 0, res.output
    back = json.loads((tmp_path / "back.json").read_text())
    assert len(back["images"]) == 3
    copies = sorted((tmp_path / "yolo" / "images").rglob("*.tif"))
    assert len(copies) == 3
    for p in copies:
        assert np.array_equal(np.asarray(Image.open(p)), frames[p.name])


def test_check_fails_an_rgb_frame_among_thermal_ones(tmp_path: Path) -> None:
    ann = _thermal(tmp_path / "set", images=3)
    Image.new("RGB", (150, 100)).save(ann.parent / "images" / "frame_00002.png")
    res = CliRunner().invoke(app, ["data", "check", str(ann), "--store", str(tmp_path)])
    assert res.exit_code == 1
    assert "mixed_channels (1):" in res.output and "frame_00002.png (mode RGB)" in res.output
