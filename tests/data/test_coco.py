"""COCO reading: round trip on a tiny on-disk set, label map, resize, and one-line errors on bad input."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from musubi.contract.errors import ConfigError
from musubi.data import coco_file
from musubi.data.coco import CocoDetection


def _png(path: Path, w: int, h: int, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8)
    Image.fromarray(pixels.numpy(), "RGB").save(path)


def _coco_json() -> dict[str, Any]:
    return {
        "images": [
            {"id": 2, "file_name": "sub/b.png", "width": 40, "height": 80},
            {"id": 1, "file_name": "a.png", "width": 64, "height": 48},
            {"id": 3, "file_name": "c.png", "width": 32, "height": 32},
        ],
        "categories": [{"id": 7, "name": "boat"}, {"id": 3, "name": "person"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 7, "bbox": [4, 6, 10, 12], "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 3, "bbox": [0, 0, 30, 30], "iscrowd": 1},
            {"id": 3, "image_id": 2, "category_id": 3, "bbox": [5, 5, 0, 10]},
            {"id": 4, "image_id": 2, "category_id": 3, "bbox": [0, 0, 20, 40]},
            # Spills over the right/bottom edge: clipped to the declared 64x48.
            {"id": 5, "image_id": 1, "category_id": 3, "bbox": [60, 40, 10, 10]},
        ],
    }


@pytest.fixture
def coco_dir(tmp_path: Path) -> tuple[Path, Path]:
    images = tmp_path / "images"
    _png(images / "a.png", 64, 48, 0)
    _png(images / "sub" / "b.png", 40, 80, 1)
    _png(images / "c.png", 32, 32, 2)
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(_coco_json()))
    return images, ann


def _write(tmp_path: Path, data: Any) -> Path:
    ann = tmp_path / "bad.json"
    ann.write_text(data if isinstance(data, str) else json.dumps(data))
    return ann


def _one_line_error(match: str, fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError, match=match) as info:
        fn(*args, **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_round_trip(coco_dir: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    images, ann = coco_dir
    with caplog.at_level(logging.WARNING, logger="musubi.data.coco"):
        ds = CocoDetection(images, ann)
    assert "1 crowd" in caplog.text and "1 degenerate" in caplog.text
    assert len(ds) == 3 and ds.num_classes == 2
    assert ds.category_ids == (3, 7) and ds.category_names == {3: "person", 7: "boat"}
    assert (ds.stats.crowd_skipped, ds.stats.degenerate_dropped, ds.stats.boxes) == (1, 1, 3)

    image, target = ds[0]  # sorted by image id: a.png
    assert image.dtype == torch.float32 and image.shape == (3, 48, 64)
    expected = pil_to_tensor(Image.open(images / "a.png").convert("RGB")).float() / 255
    assert torch.equal(image, expected)
    assert target["boxes"].dtype == torch.float32 and target["labels"].dtype == torch.int64
    assert target["boxes"].tolist() == [[4, 6, 14, 18], [60, 40, 64, 48]]
    assert target["labels"].tolist() == [2, 1]  # id 7 -> 2, id 3 -> 1 (sorted by id)
    assert int(target["image_id"]) == 1

    image, target = ds[1]
    assert image.shape == (3, 80, 40) and target["boxes"].tolist() == [[0, 0, 20, 40]]
    image, target = ds[2]
    assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)


def test_resize_scales_boxes(coco_dir: tuple[Path, Path]) -> None:
    images, ann = coco_dir
    ds = CocoDetection(images, ann, image_size=32)
    image, target = ds[0]
    assert image.shape == (3, 24, 32)  # longer side 64 -> 32
    assert target["boxes"].tolist() == [[2, 3, 7, 9], [30, 20, 32, 24]]
    image, target = ds[1]
    assert image.shape == (3, 32, 16) and target["boxes"].tolist() == [[0, 0, 8, 16]]


def test_label_map_from_train_split(coco_dir: tuple[Path, Path], tmp_path: Path) -> None:
    images, ann = coco_dir
    data = _coco_json()
    data["categories"] = [{"id": 7, "name": "boat"}]  # val lists fewer categories: labels must not shift
    data["annotations"] = [a for a in data["annotations"] if a["category_id"] == 7]
    val = CocoDetection(images, _write(tmp_path, data), category_ids=(3, 7))
    assert val[0][1]["labels"].tolist() == [2]
    data["annotations"].append({"id": 9, "image_id": 1, "category_id": 99, "bbox": [1, 1, 2, 2]})
    _one_line_error("category_id 99", CocoDetection, images, _write(tmp_path, data), category_ids=(3, 7))


def test_missing_and_malformed_files(coco_dir: tuple[Path, Path], tmp_path: Path) -> None:
    images, ann = coco_dir
    _one_line_error("annotation file not found", CocoDetection, images, tmp_path / "nope.json")
    _one_line_error("not valid JSON", CocoDetection, images, _write(tmp_path, "{not json"))
    _one_line_error(
        "missing the COCO list 'categories'",
        CocoDetection,
        images,
        _write(tmp_path, {"images": [], "annotations": []}),
    )
    _one_line_error("top level is not a JSON object", CocoDetection, images, _write(tmp_path, [1, 2]))
    _one_line_error("image directory not found", CocoDetection, tmp_path / "no_images", ann)
    bad_box = _coco_json()
    bad_box["annotations"][0]["bbox"] = [1, 2, 3]
    _one_line_error(r"bbox is not \[x, y, w, h\]", CocoDetection, images, _write(tmp_path, bad_box))
    (images / "c.png").unlink()
    _one_line_error("1 of 3 images .* missing .*c.png", CocoDetection, images, ann)


@pytest.mark.parametrize(
    "name", ["../secret.png", "sub/../../x.png", "/etc/passwd", "C:\\x.png", "..\\x.png"]
)
def test_refuses_paths_that_escape(coco_dir: tuple[Path, Path], tmp_path: Path, name: str) -> None:
    images, _ = coco_dir
    data = _coco_json()
    data["images"][0]["file_name"] = name
    msg = _one_line_error("escapes the image directory", CocoDetection, images, _write(tmp_path, data))
    assert "bad.json" in msg


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_size_limits(coco_dir: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    images, ann = coco_dir
    monkeypatch.setattr(coco_file, "MAX_ANNOTATION_BYTES", 100)
    _one_line_error("limit", CocoDetection, images, ann)
    monkeypatch.undo()
    ds = CocoDetection(images, ann)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # a.png has 3072 pixels
    _one_line_error("pixel limit", ds.__getitem__, 0)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # under 1x: our check, not PIL's warning
    _one_line_error("3072 pixels|64x48 pixels", ds.__getitem__, 0)
    (images / "a.png").write_bytes(b"not a png")
    monkeypatch.undo()
    _one_line_error("cannot read image", ds.__getitem__, 0)
