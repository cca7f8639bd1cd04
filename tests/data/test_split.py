"""`musubi data split` by group, and the leakage check of `data check` across splits (same frame, near copies)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from PIL import Image
from typer.testing import CliRunner

from musubi.cli import app

from .sets import edit, small_set

runner = CliRunner()


def _tiles(tmp_path: Path) -> Path:
    """Six 512x384 synthetic frames cut into 256 px tiles (6 per frame); returns the tiles' folder."""
    ann = small_set(tmp_path / "frames", images=6, width=512, height=384, objects=12)
    res = runner.invoke(app, ["data", "slice", str(ann), "--tile", "256", "--overlap", "0.2", "--empty-ratio", "1",
                              "--out", str(tmp_path / "tiles")])
    assert res.exit_code == 0, res.output
    return tmp_path / "tiles"


def _check(*paths: Path | str) -> tuple[int, dict]:
    res = runner.invoke(app, ["data", "check", *map(str, paths), "--json"])
    return res.exit_code, json.loads(res.output)


def _write_split(tiles: Path, name: str, keep: set[int]) -> Path:
    data = json.loads((tiles / "annotations.json").read_text())
    data["images"] = [i for i in data["images"] if i["id"] in keep]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in keep]
    (tiles / name).write_text(json.dumps(data))
    return tiles / name


def test_a_random_tile_split_leaks_and_a_frame_split_does_not(tmp_path: Path) -> None:
    tiles = _tiles(tmp_path)
    ids = [i["id"] for i in json.loads((tiles / "annotations.json").read_text())["images"]]
    random.Random(0).shuffle(ids)
    cut = len(ids) * 4 // 5
    train, val = _write_split(tiles, "rtrain.json", set(ids[:cut])), _write_split(tiles, "rval.json", set(ids[cut:]))
    # Before: a random tile split passed `data check` without a word.
    code, out = _check(f"{tiles / 'images'}::{train}", f"{tiles / 'images'}::{val}")
    assert code == 1 and not out["ok"] and len(out["same_frame_across_splits"]) >= 1
    assert any(r["check"] == "data.leakage" and r["status"] == "WARN" for r in out["results"])
    assert "are tiles of one frame" in out["same_frame_across_splits"][0]

    res = runner.invoke(app, ["data", "split", str(tiles / "annotations.json"), "--out", str(tmp_path / "split"),
                              "--ratios", "0.67,0.33", "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert "6 groups by frame" in res.output and "train: 24 images" in res.output
    pair = [f"{tiles / 'images'}::{tmp_path / 'split' / n}.json" for n in ("train", "val")]
    code, out = _check(*pair)
    assert code == 0 and out["ok"], out["results"]
    assert out["same_frame_across_splits"] == out["near_identical_across_splits"] == []
    assert not any(r["check"] == "data.leakage" for r in out["results"])


def test_split_round_trip_is_the_source_again_and_the_same_seed_gives_the_same_split(tmp_path: Path) -> None:
    tiles = _tiles(tmp_path)
    source = json.loads((tiles / "annotations.json").read_text())
    for out in ("a", "b"):
        res = runner.invoke(app, ["data", "split", str(tiles), "--out", str(tmp_path / out),
                                  "--ratios", "0.5,0.25,0.25", "--seed", "7", "--json"])
        assert res.exit_code == 0, res.output
    parts = {n: json.loads((tmp_path / "a" / f"{n}.json").read_text()) for n in ("train", "val", "test")}
    for n, part in parts.items():
        assert (tmp_path / "b" / f"{n}.json").read_text() == json.dumps(part)  # same seed, same bytes
        assert part["categories"] == source["categories"]
        assert part["info"]["musubi_split"] == {"name": n, "source": str(tiles / "annotations.json"), "by": "frame",
                                                "seed": 7, "ratios": {"train": 0.5, "val": 0.25, "test": 0.25}}
    images = sorted((i for p in parts.values() for i in p["images"]), key=lambda i: i["id"])
    anns = sorted((a for p in parts.values() for a in p["annotations"]), key=lambda a: a["id"])
    assert images == source["images"] and anns == source["annotations"]  # every entry once, unchanged
    frames = [{i["frame_id"] for i in p["images"]} for p in parts.values()]
    assert all(f for f in frames) and sum(len(f) for f in frames) == len(set().union(*frames)) == 6


def test_near_copies_are_found_across_splits_and_kept_together_by_split(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "set", images=8, width=320, height=240, objects=6)
    images = tmp_path / "set" / "images"
    # A re-encoded, slightly resized copy of frame 0 listed as another image: the same picture.
    Image.open(images / "frame_00000.jpg").resize((300, 225)).save(images / "copy.jpg", quality=80)

    def add_copy(d: dict) -> None:
        d["images"].append({"id": 100, "file_name": "copy.jpg", "width": 300, "height": 225})

    edit(ann, add_copy)
    data = json.loads(ann.read_text())
    for name, ids in (("t.json", {i["id"] for i in data["images"]} - {100}), ("v.json", {100})):
        (tmp_path / "set" / name).write_text(json.dumps({**data, "images": [i for i in data["images"]
                                                                           if i["id"] in ids]}))
    code, out = _check(f"{images}::{tmp_path / 'set' / 't.json'}", f"{images}::{tmp_path / 'set' / 'v.json'}")
    assert code == 1 and len(out["near_identical_across_splits"]) == 1, out
    assert out["near_identical_across_splits"][0].startswith("v/copy.jpg ~ t/frame_00000.jpg (thumbnail cosine")
    res = runner.invoke(app, ["data", "split", str(ann), "--out", str(tmp_path / "split"), "--ratios", "0.5,0.5",
                              "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["joined_by_content"] == 1
    sides = [{i["file_name"] for i in json.loads((tmp_path / "split" / f"{n}.json").read_text())["images"]}
             for n in ("train", "val")]
    assert any({"copy.jpg", "frame_00000.jpg"} <= s for s in sides)


def test_split_by_an_image_field_and_its_one_line_errors(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "set", images=9, width=96, height=64)

    def sites(d: dict) -> None:
        for n, i in enumerate(d["images"]):
            i["site"] = f"site{n % 3}"

    edit(ann, sites)
    res = runner.invoke(app, ["data", "split", str(ann), "--by", "site", "--ratios", "0.67,0.33",
                              "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    parts = [{i["site"] for i in json.loads((tmp_path / "s" / f"{n}.json").read_text())["images"]}
             for n in ("train", "val")]
    assert parts[0].isdisjoint(parts[1]) and len(parts[0]) == 2 and len(parts[1]) == 1
    for args, message in (
        (["--by", "sequence"], "has no 'sequence' value; add it to every image entry, or split --by frame"),
        (["--ratios", "0.8,0.3"], "--ratios '0.8,0.3': give two or more fractions in (0, 1) that sum to 1"),
        (["--by", "site", "--ratios", "0.25,0.25,0.25,0.25", "--names", "a,b,c,d"],
         "only 3 groups by site (tiles of one frame and copies joined); 4 splits need at least as many"),
        (["--ratios", "0.5,0.5", "--names", "train,train"], "--names 'train,train': give 2 distinct names"),
    ):
        bad = runner.invoke(app, ["data", "split", str(ann), "--out", str(tmp_path / "bad"), *args])
        assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1, bad.output
        assert message in bad.output.replace("\n", "") and not (tmp_path / "bad").exists()
    again = runner.invoke(app, ["data", "split", str(ann), "--out", str(tmp_path / "s")])
    assert again.exit_code == 2 and "not an empty folder" in again.output
