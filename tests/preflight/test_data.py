"""Data checks on crafted datasets on disk, read by the real readers (COCO through musubi.data.coco)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from musubi.config.job import DataSpec
from musubi.preflight.checks.data import check_data
from musubi.preflight.read.data import data_targets, read_data
from musubi.preflight.result import Status

from .crafted import only


def _img(path: Path, w: int, h: int, fmt: str = "PNG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A colour of its own per file: byte-identical images are a finding of their own (duplicate_image).
    c = zlib.crc32(str(path).encode())
    Image.new("RGB", (w, h), (c & 255, (c >> 8) & 255, (c >> 16) & 255)).save(path, fmt)


def _coco(root: Path, images: list[tuple[str, int, int]], anns: list[dict[str, Any]],
          cats: tuple[str, ...] = ("boat", "person"), name: str = "instances_train.json") -> Path:
    """COCO layout: root/annotations/instances_train.json + root/train/<images>."""
    data = {
        "images": [{"id": i + 1, "file_name": f, "width": w, "height": h} for i, (f, w, h) in enumerate(images)],
        "categories": [{"id": i + 1, "name": c} for i, c in enumerate(cats)],
        "annotations": [{"id": n + 1, "iscrowd": 0, **a} for n, a in enumerate(anns)],
    }
    ann = root / "annotations" / name
    ann.parent.mkdir(parents=True, exist_ok=True)
    ann.write_text(json.dumps(data), encoding="utf-8")
    return ann


@pytest.fixture
def good(tmp_path: Path) -> Path:
    for f in ("a.png", "b.png"):
        _img(tmp_path / "train" / f, 64, 48)
    return _coco(tmp_path, [("a.png", 64, 48), ("b.png", 64, 48)],
                 [{"image_id": 1, "category_id": 1, "bbox": [4, 4, 10, 10]},
                  {"image_id": 2, "category_id": 2, "bbox": [0, 0, 64, 48]}])


def check(*targets: str):
    return check_data([read_data(t) for t in targets])


def test_a_good_coco_set_passes_with_counts_and_finds_its_image_dir(good: Path) -> None:
    r = only(check(str(good)))
    assert r.status is Status.PASS
    assert r.found.startswith(f"{good}: 2 images, 2 boxes, 2 categories; every image decodes, every box inside")


def test_missing_images_fail_naming_the_first(good: Path) -> None:
    (good.parents[1] / "train" / "b.png").unlink()
    r = only(check(str(good)))
    assert (r.check, r.status) == ("data.coco", Status.FAIL)
    assert r.found == f"{good}: 1 of 2 images listed in the annotations are missing (first: b.png)"


def test_a_truncated_jpeg_fails_as_undecodable(tmp_path: Path) -> None:
    _img(tmp_path / "train" / "a.jpg", 256, 256, "JPEG")
    _img(tmp_path / "train" / "b.jpg", 256, 256, "JPEG")
    raw = (tmp_path / "train" / "b.jpg").read_bytes()
    (tmp_path / "train" / "b.jpg").write_bytes(raw[: len(raw) // 2])
    ann = _coco(tmp_path, [("a.jpg", 256, 256), ("b.jpg", 256, 256)], [])
    r = only(check(str(ann)))
    assert r.status is Status.FAIL and "1 of 2 images do not decode (first: b.jpg (OSError: " in r.found
    assert r.fix == "replace or remove them (and their annotations)"


def test_boxes_outside_the_image_and_empty_boxes_warn(tmp_path: Path) -> None:
    _img(tmp_path / "train" / "a.png", 64, 48)
    ann = _coco(tmp_path, [("a.png", 64, 48)], [
        {"image_id": 1, "category_id": 1, "bbox": [60, 40, 20, 20]},
        {"image_id": 1, "category_id": 2, "bbox": [5, 5, 0, 10]},
        {"image_id": 1, "category_id": 2, "bbox": [1, 1, 5, 5]},
    ])
    results = {r.found.split(": ", 1)[1].split(" (first")[0]: r for r in check(str(ann))}
    outside = results["1 of 3 boxes extend outside their image"]
    assert outside.status is Status.WARN and "a.png (annotations[0] bbox [60, 40, 20, 20]) in 64x48" in outside.found
    empty = results["1 of 3 boxes have zero or negative width/height"]
    assert empty.status is Status.WARN and empty.fix == "fix them: training drops them"


def test_declared_size_that_differs_from_the_file_warns(tmp_path: Path) -> None:
    _img(tmp_path / "train" / "a.png", 32, 32)
    r = only(check(str(_coco(tmp_path, [("a.png", 64, 48)], []))))
    assert r.status is Status.WARN and "a.png (declared 64x48, is 32x32)" in r.found


def test_unknown_category_fails_naming_the_annotation(good: Path) -> None:
    data = json.loads(good.read_text())
    data["annotations"][0]["category_id"] = 9
    good.write_text(json.dumps(data))
    r = only(check(str(good)))
    assert r.status is Status.FAIL
    assert r.found == (f"{good}: 1 of 2 annotations refer to an unknown category "
                       "(first: annotations[0] category_id 9)")
    assert r.fix == "add the category or fix the category_id"


def test_missing_or_broken_annotation_file_fails(tmp_path: Path) -> None:
    bad = tmp_path / "ann.json"
    bad.write_text("{not json", encoding="utf-8")
    r = only(check(str(tmp_path / "images") + "::" + str(bad)))
    assert r.status is Status.FAIL and r.found.startswith(f"{bad}: not valid JSON (line 1")
    gone = only(check(str(tmp_path / "nowhere.json")))
    assert gone.status is Status.FAIL and gone.found == f"{tmp_path / 'nowhere.json'}: no such file or directory"


def test_an_image_directory_that_cannot_be_found_fails(tmp_path: Path) -> None:
    ann = _coco(tmp_path, [("x.png", 8, 8)], [])
    r = only(check(str(ann)))
    assert r.status is Status.FAIL and "cannot find the image directory" in r.found
    assert r.fix == f"give --data IMAGES_DIR::{ann}"


def test_val_categories_missing_from_train_fail(tmp_path: Path, good: Path) -> None:
    _img(tmp_path / "val" / "c.png", 16, 16)
    val = _coco(tmp_path, [("c.png", 16, 16)], [], cats=("boat", "person", "kayak"), name="instances_val.json")
    r = only([r for r in check(str(good), str(val)) if r.status is Status.FAIL])
    assert r.found == f"{val} has categories not in {good}: kayak" and r.fix == "use the same categories in every split"


def test_image_folder_with_an_empty_class_and_a_broken_image_fails(tmp_path: Path) -> None:
    _img(tmp_path / "cat" / "1.png", 8, 8)
    (tmp_path / "cat" / "2.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    (tmp_path / "dog").mkdir()
    results = check(str(tmp_path))
    assert {(r.check, r.status) for r in results} == {("data.image_folder", Status.FAIL)}
    found = " | ".join(r.found for r in results)
    assert "1 of 2 class folders hold no images (first: " in found and "dog" in found
    assert "1 of 2 images do not decode (first: cat/2.png (" in found


def test_text_that_is_not_utf8_or_empty_fails(tmp_path: Path) -> None:
    latin = tmp_path / "corpus.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    r = only(check(str(latin)))
    assert (r.check, r.status) == ("data.text", Status.FAIL)
    assert r.found == f"{latin}: not UTF-8 text (bad byte near offset 3)" and r.fix == "convert it to UTF-8"
    (tmp_path / "empty.txt").write_bytes(b"")
    assert only(check(str(tmp_path / "empty.txt"))).found.endswith("empty file")


def test_job_splits_become_data_targets() -> None:
    spec = DataSpec(train={"path": "imgs/train", "annotations": "ann/train.json"}, val={"path": "imgs/val",
                                                                                        "annotations": None})
    assert data_targets(spec) == ["imgs/train::ann/train.json", "imgs/val"]
    assert data_targets(DataSpec(synthetic={})) == []
