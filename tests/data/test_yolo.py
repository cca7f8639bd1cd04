"""COCO -> YOLO -> COCO gives the same images, categories and boxes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from musubi.cli import app

from .sets import edit, small_set


def test_round_trip_through_the_cli(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "src", images=3, width=120, height=80, objects=5)
    # Non-contiguous category ids and fractional boxes survive the trip.
    edit(ann, lambda d: ([c.update(id=c["id"] * 10) for c in d["categories"]],
                         [a.update(category_id=a["category_id"] * 10, bbox=[v + 0.25 for v in a["bbox"]])
                          for a in d["annotations"]]))
    runner = CliRunner()
    res = runner.invoke(app, ["data", "convert", str(ann), "--to", "yolo", "--out", str(tmp_path / "yolo")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "yolo" / "data.yaml").is_file() and len(list((tmp_path / "yolo" / "labels").glob("*.txt"))) == 3
    back = tmp_path / "back.json"
    res = runner.invoke(app, ["data", "convert", str(tmp_path / "yolo"), "--to", "coco", "--out", str(back)])
    assert res.exit_code == 0, res.output
    a, b = json.loads(ann.read_text()), json.loads(back.read_text())
    assert [(c["id"], c["name"]) for c in a["categories"]] == [(c["id"], c["name"]) for c in b["categories"]]
    name_a = {i["id"]: i["file_name"] for i in a["images"]}
    name_b = {i["id"]: i["file_name"] for i in b["images"]}
    assert sorted(name_a.values()) == sorted(name_b.values())

    def boxes(data: dict, names: dict) -> list:
        return sorted((names[x["image_id"]], x["category_id"], *x["bbox"]) for x in data["annotations"])

    for x, y in zip(boxes(a, name_a), boxes(b, name_b), strict=True):
        assert x[:2] == y[:2] and x[2:] == pytest.approx(y[2:], abs=1e-4)


def test_bad_yolo_label_is_one_line(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "src", images=1)
    runner = CliRunner()
    assert runner.invoke(app, ["data", "convert", str(ann), "--to", "yolo", "--out", str(tmp_path / "y")]).exit_code == 0
    (tmp_path / "y" / "labels" / "frame_00000.txt").write_text("0 0.5 oops 0.1 0.1\n")
    res = runner.invoke(app, ["data", "convert", str(tmp_path / "y"), "--to", "coco", "--out", str(tmp_path / "b.json")])
    assert res.exit_code == 2 and "frame_00000.txt:1: not 'class cx cy w h'" in res.output
    res = runner.invoke(app, ["data", "convert", str(ann), "--to", "voc", "--out", str(tmp_path / "v")])
    assert res.exit_code == 2 and "give yolo or coco" in res.output


def test_convert_clips_refuses_collisions_keeps_splits_and_ids(tmp_path: Path) -> None:
    # Before: cx > 1 for an overhanging box, negative boxes written, x.jpg/x.png labels overwritten,
    # val = train, and image ids renumbered 1..N.
    import shutil

    import yaml

    ann = small_set(tmp_path / "src", images=3, width=120, height=80, objects=2)

    def brk(d: dict) -> None:
        d["annotations"][0]["bbox"] = [110, 10, 40, 20]  # overhangs the right edge
        d["annotations"][1]["bbox"] = [10, 10, -5, 5]  # negative width
        for img in d["images"]:
            img["id"] += 100
        for a in d["annotations"]:
            a["image_id"] += 100

    edit(ann, brk)
    val = small_set(tmp_path / "val", images=2, width=120, height=80, objects=2, seed=1)
    runner = CliRunner()
    res = runner.invoke(app, ["data", "convert", str(ann), "--val", str(val), "--to", "yolo",
                              "--out", str(tmp_path / "y")])
    assert res.exit_code == 0, res.output
    assert "1 clipped" in res.output and "1 dropped" in res.output
    meta = yaml.safe_load((tmp_path / "y" / "data.yaml").read_text())
    assert meta["train"] == "images/train" and meta["val"] == "images/val"
    assert len(list((tmp_path / "y" / "images" / "val").iterdir())) == 2
    for label in (tmp_path / "y" / "labels").rglob("*.txt"):
        for line in label.read_text().splitlines():
            cx, cy, w, h = (float(v) for v in line.split()[1:])
            assert all(0 <= v <= 1 for v in (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, w, h)), line
    back = tmp_path / "back"
    res = runner.invoke(app, ["data", "convert", str(tmp_path / "y"), "--to", "coco", "--out", str(back)])
    assert res.exit_code == 0, res.output
    train = json.loads((back / "train.json").read_text())
    assert sorted(i["id"] for i in train["images"]) == [101, 102, 103]
    assert len(json.loads((back / "val.json").read_text())["images"]) == 2
    assert f"{tmp_path / 'y' / 'images' / 'train'}::{back / 'train.json'}" in res.output
    # A broken line in the val split: refused before train.json is written, so a rerun works.
    next((tmp_path / "y" / "labels" / "val").glob("*.txt")).write_text("0 0.5 oops 0.1 0.1\n")
    back2 = tmp_path / "back2"
    res = runner.invoke(app, ["data", "convert", str(tmp_path / "y"), "--to", "coco", "--out", str(back2)])
    assert res.exit_code == 2 and "fix the line" in res.output and not back2.exists(), res.output
    # Two frames that would share one label file: refused before anything is written.
    shutil.copy(ann.parent / "images" / "frame_00001.jpg", ann.parent / "images" / "frame_00000.png")
    edit(ann, lambda d: d["images"][1].update(file_name="frame_00000.png"))
    res = runner.invoke(app, ["data", "convert", str(ann), "--to", "yolo", "--out", str(tmp_path / "y2")])
    assert res.exit_code == 2 and "would share labels/frame_00000.txt" in res.output
    assert not (tmp_path / "y2").exists()
    # A malformed entry: one line, not a traceback.
    edit(ann, lambda d: d["annotations"].append(7))
    res = runner.invoke(app, ["data", "convert", str(ann), "--to", "yolo", "--out", str(tmp_path / "y3")])
    assert res.exit_code == 2 and "bad_annotation_entry" in res.output and "data check" in res.output
