"""Sliced data on real JPEG files: inline tiles equal the frame's pixels, the RAM cache, `musubi data slice`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from typer.testing import CliRunner

from musubi.cli import app
from musubi.data.coco import CocoDetection
from musubi.data.sliced import SlicedCocoDetection
from musubi.data.slicing import SliceParams, tile_grid

from .sets import edit, small_set


def test_tiles_are_crops_of_the_frame_with_shifted_boxes(tmp_path: Path) -> None:
    ann = small_set(tmp_path, images=2, width=200, height=120, objects=8)
    frames = CocoDetection(tmp_path / "images", ann)
    ds = SlicedCocoDetection(frames, SliceParams(tile=64, overlap=0.25, empty_ratio=1.0), as_uint8=True)
    assert ds.tiles_per_image == [len(tile_grid(200, 120, 64, 0.25))] * 2 and len(ds) == sum(ds.tiles_per_image)
    frame = np.asarray(Image.open(tmp_path / "images" / "frame_00001.jpg").convert("RGB"))
    for i, ref in enumerate(ds.tiles):
        if ref.image != 1:
            continue
        image, target = ds[i]
        x0, y0, x1, y1 = ref.window
        crop = torch.from_numpy(np.array(frame[y0:y1, x0:x1])).permute(2, 0, 1)
        assert image.dtype == torch.uint8 and torch.equal(image, crop)
        assert (target["boxes"][:, 2:] <= 64).all() and (target["labels"] >= 1).all()


def test_ram_cache_is_shared_with_loader_workers_and_gives_the_same_pixels(tmp_path: Path) -> None:
    ann = small_set(tmp_path, images=2, width=160, height=96)
    frames = CocoDetection(tmp_path / "images", ann)
    plain = SlicedCocoDetection(frames, SliceParams(tile=48, overlap=0.0, empty_ratio=1.0))
    cached = SlicedCocoDetection(frames, SliceParams(tile=48, overlap=0.0, empty_ratio=1.0), cache=True)
    assert cached.cached is not None and int(cached.cached.sum()) == 0
    loader = DataLoader(cached, batch_size=4, num_workers=2, collate_fn=lambda s: s)
    got = [s for batch in loader for s in batch]
    # Workers decoded the frames and filled the shared buffer the parent sees.
    assert int(cached.cached.sum()) == len(cached)
    for i, (image, _) in enumerate(got):
        assert torch.equal(image, plain[i][0]) and torch.equal(cached[i][0], plain[i][0])


def test_slice_command_writes_tiles_and_reports_counts(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "src", images=2, width=200, height=120, objects=6)
    out = tmp_path / "tiles"
    res = CliRunner().invoke(app, ["data", "slice", str(ann), "--tile", "64", "--overlap", "0.2",
                                   "--empty-ratio", "1", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    per = len(tile_grid(200, 120, 64, 0.2))
    assert report["tiles"] == 2 * per and report["worst_case"] == per
    data = json.loads((out / "annotations.json").read_text())
    assert len(data["images"]) == 2 * per and len(list((out / "images").glob("*.jpg"))) == 2 * per
    # The tile set is itself a valid COCO set that passes the check.
    check = CliRunner().invoke(app, ["data", "check", str(out / "annotations.json"), "--store", str(tmp_path / "r")])
    assert check.exit_code == 0, check.output
    again = CliRunner().invoke(app, ["data", "slice", str(ann), "--out", str(out)])
    assert again.exit_code == 2 and "not an empty folder" in again.output
    bad = CliRunner().invoke(app, ["data", "slice", str(ann), "--overlap", "1.5", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "overlap 1.5" in bad.output


def test_slice_tiles_of_same_stem_frames_do_not_overwrite_each_other(tmp_path: Path) -> None:
    # Before: x.jpg and x.png both wrote x_0_0.jpg; 4 tiles were listed but only 2 files existed.
    ann = small_set(tmp_path / "src", images=2, width=64, height=64, objects=2)

    def same_stem(d: dict) -> None:
        d["images"][1]["file_name"] = "frame_00000.png"

    edit(ann, same_stem)
    Image.open(ann.parent / "images" / "frame_00001.jpg").save(ann.parent / "images" / "frame_00000.png")
    out = tmp_path / "tiles"
    res = CliRunner().invoke(app, ["data", "slice", str(ann), "--tile", "64", "--empty-ratio", "1",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    names = [i["file_name"] for i in json.loads((out / "annotations.json").read_text())["images"]]
    assert len(names) == len(set(names)) == 2 and len(list((out / "images").iterdir())) == 2


def test_slice_of_a_corrupt_frame_fails_in_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    # Before: an OSError traceback and a half-written --out that refused the rerun.
    ann = small_set(tmp_path / "src", images=3, width=200, height=120, objects=4)
    bad = ann.parent / "images" / "frame_00001.jpg"
    good = bad.read_bytes()
    bad.write_bytes(good[:400])
    out = tmp_path / "tiles"
    res = CliRunner().invoke(app, ["data", "slice", str(ann), "--tile", "64", "--out", str(out)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert "frame_00001.jpg" in res.output and "data check" in res.output
    assert not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "src"]
    bad.write_bytes(good)
    res = CliRunner().invoke(app, ["data", "slice", str(ann), "--tile", "64", "--out", str(out)])
    assert res.exit_code == 0, res.output


def test_synth_never_overwrites_an_existing_set(tmp_path: Path) -> None:
    # Before: synth into an existing set replaced annotations.json and left stale frames behind.
    ann = small_set(tmp_path / "set", images=2)
    before = ann.read_bytes()
    res = CliRunner().invoke(app, ["data", "synth", "--out", str(tmp_path / "set"), "--images", "1", "--size",
                                   "320x240"])
    assert res.exit_code == 2 and "not an empty folder" in res.output and len(res.output.strip().splitlines()) == 1
    assert ann.read_bytes() == before
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["data", "synth", "--out", str(tmp_path / "empty"), "--images", "1", "--size",
                                   "320x240"])
    assert res.exit_code == 0, res.output
    # one dialect: the output folder is --out, as in every data command; the old positional names the flag
    res = CliRunner().invoke(app, ["data", "synth", str(tmp_path / "new"), "--images", "1"])
    assert res.exit_code == 2 and f"give the folder as --out {tmp_path / 'new'}" in res.output
    assert not (tmp_path / "new").exists()
    assert (tmp_path / "empty" / "annotations.json").is_file()


def test_without_the_cache_tiles_are_drawn_frame_by_frame_and_each_frame_decoded_once(tmp_path: Path) -> None:
    # Before: with the cache off every tile decoded its whole frame (48 decodes of a 4000x3000 frame).
    from musubi.worker.feed.sampler import ResumableDistributedSampler

    ann = small_set(tmp_path, images=4, width=200, height=120)
    frames = CocoDetection(tmp_path / "images", ann, as_uint8=True)
    ds = SlicedCocoDetection(frames, SliceParams(tile=64, overlap=0.25, empty_ratio=1.0), as_uint8=True)
    opened: list[Path] = []
    real = frames._open
    frames._open = lambda p: (opened.append(p), real(p))[1]  # type: ignore[method-assign]
    ranks = [ResumableDistributedSampler(ds, 2, r, seed=3) for r in range(2)]
    orders = [list(s) for s in ranks]
    assert sorted(orders[0] + orders[1]) == list(range(len(ds)))  # a partition (len is even here)
    for i in orders[0]:
        ds[i]
    assert len(opened) == len({ds.tiles[i].image for i in orders[0]})  # one decode per frame
    # Frames come whole and in another order next epoch; a resumed position gives the same tail.
    runs = sum(1 for a, b in zip(orders[0], orders[0][1:], strict=False) if ds.tiles[a].image != ds.tiles[b].image)
    assert runs <= 2
    ranks[0].set_position(1, 0)
    e1 = list(ranks[0])
    assert e1 != orders[0]
    ranks[0].set_position(1, 5)
    assert list(ranks[0]) == e1[5:]
    cached = SlicedCocoDetection(frames, SliceParams(tile=64, overlap=0.25, empty_ratio=1.0), cache=True)
    assert cached.frame_groups is None  # with the cache the plain shuffled order is kept


def test_offline_sliced_train_with_sliced_eval_on_whole_frames(tmp_path: Path) -> None:
    # Before: sliced evaluation came only with inline slicing of the train split.
    import pytest

    from musubi.config.load import job_from_dict
    from musubi.contract.errors import ConfigError
    from musubi.tasks.registry import build_task

    frames_ann = small_set(tmp_path / "frames", images=2, width=200, height=120)
    assert CliRunner().invoke(app, ["data", "slice", str(frames_ann), "--tile", "64", "--empty-ratio", "1",
                                    "--out", str(tmp_path / "tiles")]).exit_code == 0
    job = {"name": "d", "task": "detection", "model": "fcos_resnet50_fpn",
           "data": {"train": {"path": str(tmp_path / "tiles" / "images"),
                              "annotations": str(tmp_path / "tiles" / "annotations.json")},
                    "val": {"path": str(tmp_path / "frames" / "images"), "annotations": str(frames_ann)},
                    "slice": {"tile": 64, "inline_train": False}}}
    task = build_task(job_from_dict(job))
    train, val = task.train_dataset(), task.val_dataset()
    assert type(train) is CocoDetection and len(train) == len(json.loads(
        (tmp_path / "tiles" / "annotations.json").read_text())["images"])
    assert type(val) is CocoDetection and len(val) == 2  # whole frames, predicted on tiles
    job["data"]["slice"]["sliced_eval"] = False
    with pytest.raises(ConfigError, match="inline_train"):
        job_from_dict(job)


def test_an_out_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    # Before: NotADirectoryError traceback from iterdir().
    ann = small_set(tmp_path / "src", images=1)
    (tmp_path / "f").write_text("keep me")
    for args in (["data", "slice", str(ann), "--out", str(tmp_path / "f")],
                 ["data", "convert", str(ann), "--to", "yolo", "--out", str(tmp_path / "f")],
                 ["data", "synth", "--out", str(tmp_path / "f")]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "not an empty folder" in res.output, (args, res.output)
    assert (tmp_path / "f").read_text() == "keep me"
