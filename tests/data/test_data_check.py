"""`musubi data check`: each crafted problem is found, named and listed; the CLI exits 1 on it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from musubi.cli import app
from musubi.preflight.read.data import read_data

from .sets import edit, small_set


def _kinds(ann: Path) -> dict[str, list[str]]:
    r = read_data(str(ann), examples=100)
    assert r.error is None, r.error
    return {i.kind: list(i.examples) for i in r.issues}


def _break_missing(ann: Path) -> None:
    (ann.parent / "images" / "frame_00001.jpg").unlink()


def _break_corrupt(ann: Path) -> None:
    p = ann.parent / "images" / "frame_00002.jpg"
    p.write_bytes(p.read_bytes()[:300])  # truncated JPEG


def _box(i: int, bbox: list[float]) -> Any:
    return lambda d: d["annotations"][i].update(bbox=bbox)


CASES = {
    "missing": (_break_missing, "frame_00001.jpg"),
    "undecodable": (_break_corrupt, "frame_00002.jpg"),
    "box_outside": (lambda a: edit(a, _box(0, [90, 10, 30, 10])), "annotations[0]"),
    "empty_box": (lambda a: edit(a, _box(1, [10, 10, 0, 5])), "annotations[1]"),
    "unknown_category": (lambda a: edit(a, lambda d: d["annotations"][2].update(category_id=99)),
                         "annotations[2] category_id 99"),
    "unknown_image": (lambda a: edit(a, lambda d: d["annotations"][3].update(image_id=77)), "image_id 77"),
    "duplicate_image_id": (lambda a: edit(a, lambda d: d["images"][1].update(id=1)), "image id 1"),
    "duplicate_annotation_id": (lambda a: edit(a, lambda d: d["annotations"][1].update(id=1)),
                                "annotation id 1"),
    "duplicate_file_name": (lambda a: edit(a, lambda d: d["images"][2].update(file_name="frame_00000.jpg")),
                            "frame_00000.jpg"),
    "duplicate_image": (lambda a: shutil.copy(a.parent / "images" / "frame_00000.jpg",
                                              a.parent / "images" / "frame_00001.jpg"),
                        "frame_00001.jpg = frame_00000.jpg"),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_broken_set_is_named_and_listed(tmp_path: Path, kind: str) -> None:
    ann = small_set(tmp_path)
    assert _kinds(ann) == {}
    brk, offender = CASES[kind]
    brk(ann)
    found = _kinds(ann)
    assert kind in found and any(offender in ex for ex in found[kind]), found
    # Nothing else is reported for a single defect (duplicate ids also make one image's boxes unknown).
    assert set(found) <= {kind, "unknown_image"}, found


def test_cli_exits_1_lists_every_offender_and_counts_per_class(tmp_path: Path) -> None:
    ann = small_set(tmp_path, images=4, objects=6)
    runner = CliRunner()
    ok = runner.invoke(app, ["data", "check", str(ann), "--json", "--store", str(tmp_path / "runs")])
    assert ok.exit_code == 0, ok.output
    report = json.loads(ok.output)
    assert report["ok"] and sum(report["per_class"].values()) == 24 and set(report["per_class"]) == {"class1", "class2"}
    for n in range(5):  # more offenders than the preflight's 3 examples: all listed
        edit(ann, _box(n, [-50, -50, 10, 10]))
    bad = runner.invoke(app, ["data", "check", str(ann), "--json", "--store", str(tmp_path / "runs")])
    assert bad.exit_code == 1
    issues = {i["kind"]: i for i in json.loads(bad.output)["issues"]}
    assert issues["box_outside"]["count"] == 5 and len(issues["box_outside"]["files"]) == 5
    # Files are listed, never dropped: the annotation file and images are untouched.
    assert len(json.loads(ann.read_text())["annotations"]) == 24
    warn_only = runner.invoke(app, ["data", "check", str(ann), "--allow-warnings", "--store", str(tmp_path / "r")])
    assert warn_only.exit_code == 0 and "box_outside (5):" in warn_only.output


def test_malformed_ids_are_findings_not_crashes(tmp_path: Path) -> None:
    ann = small_set(tmp_path)
    edit(ann, lambda d: d["annotations"][0].update(image_id=[1], category_id={"x": 1}))
    found = _kinds(ann)
    assert "annotations[0] image_id [1]" in found["unknown_image"][0]
    assert "annotations[0] category_id {'x': 1}" in found["unknown_category"][0]


def test_a_coco_folder_is_checked_as_coco_not_as_an_image_folder(tmp_path: Path) -> None:
    # Before: `data check DIR` read DIR as ROOT/CLASS/image and passed a set with a negative box.
    ann = small_set(tmp_path / "set")
    edit(ann, _box(0, [10, 10, -5, 5]))
    res = CliRunner().invoke(app, ["data", "check", str(tmp_path / "set"), "--json", "--store", str(tmp_path / "r")])
    assert res.exit_code == 1, res.output
    report = json.loads(res.output)
    assert report["kind"] == "coco" and {i["kind"] for i in report["issues"]} == {"empty_box"}
    # Two JSONs: ambiguous, refused in one line naming the fix (exit 2), for check and slice alike.
    shutil.copy(ann, tmp_path / "set" / "other.json")
    for args in (["data", "check", str(tmp_path / "set")],
                 ["data", "slice", str(tmp_path / "set"), "--out", str(tmp_path / "o")]):
        amb = CliRunner().invoke(app, args)
        assert amb.exit_code == 2 and "2 annotation JSON files" in amb.output and "ANN.json" in amb.output
        assert len(amb.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    # A YOLO folder is named as such, with the command that converts it.
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "data.yaml").write_text("names: [a]\n")
    yolo = CliRunner().invoke(app, ["data", "check", str(tmp_path / "y")])
    assert yolo.exit_code == 2 and "YOLO folder" in yolo.output and "--to coco" in yolo.output
    missing = CliRunner().invoke(app, ["data", "check", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "PATH" in missing.output and "no such file" in missing.output


def test_every_malformed_entry_is_listed_and_nothing_else_is_hidden(tmp_path: Path) -> None:
    # Before: the first malformed bbox aborted the check with one error and no other finding.
    ann = small_set(tmp_path, images=4, objects=4)

    def brk(d: dict[str, Any]) -> None:
        d["annotations"][0]["bbox"] = ["10", 10, 5, 5]
        d["annotations"][5]["bbox"] = [1, 2, 3]
        del d["annotations"][6]["bbox"]
        d["annotations"][12]["bbox"] = [90, 10, 30, 10]  # outside the 96x64 frame (a frame that decodes)
        d["annotations"].append(7)
        d["images"].append({"id": 99, "file_name": "../escape.jpg"})
        d["images"].append({"id": "x", "file_name": "s.jpg"})
        d["categories"].append(dict(d["categories"][0]))

    edit(ann, brk)
    _break_missing(ann)
    _break_corrupt(ann)
    res = CliRunner().invoke(app, ["data", "check", str(ann), "--json", "--store", str(tmp_path / "r")])
    assert res.exit_code == 1
    issues = {i["kind"]: i for i in json.loads(res.output)["issues"]}
    assert issues["bad_bbox"]["count"] == 3
    assert {"bad_annotation_entry", "bad_file_name", "bad_image_entry", "duplicate_category_id", "missing",
            "undecodable", "box_outside"} <= set(issues), sorted(issues)
    text = CliRunner().invoke(app, ["data", "check", str(ann), "--store", str(tmp_path / "r")])
    assert text.exit_code == 1 and "bad_bbox (3):" in text.output and "annotations[5]" in text.output


def test_duplicate_boxes_and_category_names_crowd_outside_and_unlabelled_images(tmp_path: Path) -> None:
    # Before: all of these passed silently, and per_class merged two categories of one name.
    ann = small_set(tmp_path, images=3, objects=2)

    def brk(d: dict[str, Any]) -> None:
        d["annotations"].append({**d["annotations"][0], "id": 1000})
        d["annotations"][1].update(iscrowd=1, bbox=[90, 10, 30, 10])
        d["categories"].append({"id": 9, "name": d["categories"][0]["name"]})
        d["annotations"] = [a for a in d["annotations"] if a["image_id"] != d["images"][2]["id"]]

    edit(ann, brk)
    found = _kinds(ann)
    assert "annotations[0]" in found["duplicate_box"][0]
    assert "(ids 1, 9)" in found["duplicate_category_name"][0]
    assert "(crowd)" in found["box_outside"][0]
    r = read_data(str(ann))
    assert r.counts["images_without_boxes"] == 1 and r.counts["unused_categories"] == 1
    assert len(r.per_class) == 3 and r.per_class["class1 (id 9)"] == 0
    res = CliRunner().invoke(app, ["data", "check", str(ann), "--store", str(tmp_path / "r")])
    assert res.exit_code == 1 and "categories without boxes (1): class1 (id 9)" in res.output
    assert "images without boxes: 1 of 3" in res.output


def test_exif_rotation_is_named_as_the_cause(tmp_path: Path) -> None:
    # Before: only size_mismatch/box_outside with the fix "re-export", not the real cause.
    from PIL import Image

    ann = small_set(tmp_path, images=2)
    p = ann.parent / "images" / "frame_00000.jpg"
    with Image.open(p) as im:
        exif = im.getexif()
        exif[0x0112] = 6  # rotate 90° on display
        im.save(p, exif=exif)
    found = _kinds(ann)
    assert "frame_00000.jpg (EXIF orientation 6, stored 96x64)" in found["exif_rotated"]


def test_several_splits_checked_together_find_leaks_and_category_disagreement(tmp_path: Path) -> None:
    # Before: `data check` took one PATH; nothing found the same image in train and val.
    train = small_set(tmp_path / "train", images=3)
    val = small_set(tmp_path / "val", images=2, seed=5)
    shutil.copy(train.parent / "images" / "frame_00001.jpg", val.parent / "images" / "frame_00000.jpg")
    res = CliRunner().invoke(app, ["data", "check", str(tmp_path / "train"), str(tmp_path / "val"), "--json",
                                   "--store", str(tmp_path / "r")])
    assert res.exit_code == 1, res.output
    report = json.loads(res.output)
    assert len(report["datasets"]) == 2 and len(report["duplicate_across_splits"]) == 1
    assert "frame_00000.jpg" in report["duplicate_across_splits"][0]
    edit(val, lambda d: d["categories"].append({"id": 7, "name": "boat"}))
    res = CliRunner().invoke(app, ["data", "check", str(train), str(val), "--store", str(tmp_path / "r")])
    assert res.exit_code == 1 and "categories not in" in res.output and "duplicate_across_splits (1):" in res.output


def test_a_class_folder_set_with_a_metadata_json_stays_an_image_folder(tmp_path: Path) -> None:
    from PIL import Image

    for c in ("cat", "dog"):
        (tmp_path / "set" / c).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "set" / c / "a.jpg")
    (tmp_path / "set" / "classes.json").write_text('{"names": ["cat", "dog"]}')
    res = CliRunner().invoke(app, ["data", "check", str(tmp_path / "set"), "--json", "--store", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["kind"] == "image_folder"


def test_a_coco_folder_missing_a_list_is_not_passed_as_an_image_folder(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "set")
    edit(ann, lambda d: d.pop("images"))
    res = CliRunner().invoke(app, ["data", "check", str(tmp_path / "set"), "--store", str(tmp_path / "r")])
    assert res.exit_code == 1 and "missing the COCO list 'images'" in res.output
