"""`musubi data slice` keeps each frame's format and bit depth, pads small frames; check/hash make no store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image
from typer.testing import CliRunner

from musubi.cli import app

from .sets import small_set


def _sixteen_bit_set(root: Path) -> tuple[Path, np.ndarray]:
    """One 16-bit grey PNG frame (values over 255, so an 8-bit copy cannot equal it) with two boxes."""
    (root / "images").mkdir(parents=True)
    pixels = (np.arange(150 * 100, dtype=np.uint32).reshape(100, 150) * 37 % 65536).astype(np.uint16)
    Image.fromarray(pixels).save(root / "images" / "f.png")
    ann = root / "annotations.json"
    ann.write_text(json.dumps({
        "images": [{"id": 7, "file_name": "f.png", "width": 150, "height": 100}],
        "annotations": [{"id": 1, "image_id": 7, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400,
                         "iscrowd": 0},
                        {"id": 2, "image_id": 7, "category_id": 1, "bbox": [100, 60, 30, 30], "area": 900,
                         "iscrowd": 0}],
        "categories": [{"id": 1, "name": "tree"}]}))
    return ann, pixels


def test_sixteen_bit_png_slices_losslessly_into_padded_png_tiles(tmp_path: Path) -> None:
    # Before: every tile was re-encoded as 8-bit RGB JPEG, and a frame smaller than a tile gave a smaller tile.
    ann, pixels = _sixteen_bit_set(tmp_path / "src")
    out = tmp_path / "tiles"
    res = CliRunner().invoke(app, ["data", "slice", str(ann), "--tile", "128", "--overlap", "0",
                                   "--empty-ratio", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "annotations.json").read_text())
    assert len(data["images"]) == 2  # 150 wide: two columns; 100 high: one row, padded to 128
    for entry in data["images"]:
        x0, y0, x1, y1 = entry["window"]
        assert entry["file_name"].endswith(".png") and (entry["width"], entry["height"]) == (128, 128)
        assert entry["frame_id"] == 7 and entry["frame_file"] == "f.png" and len(entry["frame_sha256"]) == 64
        with Image.open(out / "images" / entry["file_name"]) as im:
            assert im.format == "PNG" and im.mode in ("I;16", "I") and im.size == (128, 128)
            tile = np.asarray(im).astype(np.uint16)
        assert np.array_equal(tile[: y1 - y0, : x1 - x0], pixels[y0:y1, x0:x1])  # bit for bit
        assert not tile[y1 - y0 :].any() and not tile[:, x1 - x0 :].any()  # the padding is zeros


def test_jpeg_frames_stay_jpeg_and_small_frames_are_padded(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "src", images=1, width=40, height=30, objects=2)
    out = tmp_path / "tiles"
    res = CliRunner().invoke(app, ["data", "slice", str(ann), "--tile", "64", "--empty-ratio", "1",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    (entry,) = json.loads((out / "annotations.json").read_text())["images"]
    assert entry["window"] == [0, 0, 40, 30] and (entry["width"], entry["height"]) == (64, 64)
    with Image.open(out / "images" / entry["file_name"]) as im:
        assert im.format == "JPEG" and im.size == (64, 64)


def test_check_and_hash_do_not_create_a_store(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    ann = small_set(tmp_path / "set", images=2)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["data", "check", str(ann)]).exit_code == 0
    assert runner.invoke(app, ["data", "hash", str(ann)]).exit_code == 0
    assert not (tmp_path / "runs").exists()
