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
