"""Dataset versions: stable across runs and caches, changed by any byte or rename; recorded for runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from typer.testing import CliRunner

from musubi.cli import app
from musubi.data.job_version import dataset_detail, dataset_env, dataset_version
from musubi.data.version import hash_dataset

from .sets import small_set


def test_stable_and_cached(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "set")
    store = tmp_path / "runs" / "musubi.db"
    first = hash_dataset(tmp_path / "set", store)
    assert first.hashed == first.files == 4 and first.version.startswith("data-")
    cached = hash_dataset(tmp_path / "set", store)
    assert cached.version == first.version and cached.hashed == 0
    assert hash_dataset(tmp_path / "set", None, workers=1).version == first.version  # no cache, one thread
    # The COCO file covers itself and the images it lists: the same version as its folder.
    assert hash_dataset(ann, store).version == first.version and hash_dataset(ann, store).hashed == 0


def test_any_byte_rename_or_new_file_changes_the_version(tmp_path: Path) -> None:
    small_set(tmp_path / "set")
    store = tmp_path / "musubi.db"
    seen = {hash_dataset(tmp_path / "set", store).version}
    img = tmp_path / "set" / "images" / "frame_00001.jpg"
    data = bytearray(img.read_bytes())
    stat = img.stat()
    data[len(data) // 2] ^= 1
    img.write_bytes(bytes(data))
    # Same size; the mtime moves as with any real write (set here: a coarse-mtime file system could hide it).
    os.utime(img, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000))
    seen.add(hash_dataset(tmp_path / "set", store).version)
    ann = tmp_path / "set" / "annotations.json"
    ann.write_text(ann.read_text().replace('"area"', ' "area"', 1))
    seen.add(hash_dataset(tmp_path / "set", store).version)
    img.rename(img.with_name("renamed.jpg"))  # renamed in the annotation file too
    ann.write_text(ann.read_text().replace("frame_00001.jpg", "renamed.jpg"))
    seen.add(hash_dataset(tmp_path / "set", store).version)
    (tmp_path / "set" / "images" / "unlisted.jpg").write_bytes(b"x")  # not listed: not part of the set
    assert hash_dataset(tmp_path / "set", store).version in seen
    assert len(seen) == 4
    # Without the cache every byte is read: the same versions come back.
    assert hash_dataset(tmp_path / "set", None).version in seen


def test_cli_and_job_version(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "set")
    res = CliRunner().invoke(app, ["data", "hash", str(tmp_path / "set"), "--store", str(tmp_path / "runs")])
    assert res.exit_code == 0 and res.output.startswith("data-") and "4 files" in res.output
    # A command that does not need the store does not create one (before: runs/musubi.db appeared in the cwd).
    assert not (tmp_path / "runs").exists()
    hash_dataset(tmp_path / "set", tmp_path / "runs" / "musubi.db")  # a store made by training ...
    cached = CliRunner().invoke(app, ["data", "hash", str(tmp_path / "set"), "--store", str(tmp_path / "runs")])
    assert cached.output.split()[0] == res.output.split()[0] and "0 read" in cached.output  # ... is used
    gone = CliRunner().invoke(app, ["data", "hash", str(tmp_path / "nope")])
    assert gone.exit_code == 2 and "no such file or directory" in gone.output
    config = {"data": {"train": {"path": str(tmp_path / "set" / "images"), "annotations": str(ann)},
                       "image_size": None}}
    v = dataset_version(config)
    assert v is not None and v.startswith("data-")
    assert dataset_version({"data": {**config["data"], "image_size": 320}}) != v  # options are part of it
    (tmp_path / "set" / "images" / "frame_00000.jpg").write_bytes(b"changed")
    assert dataset_version(config) != v


def test_one_version_for_folder_annotation_file_and_job(tmp_path: Path) -> None:
    # Before: `data hash DIR`, `data hash ANN.json` and env.json gave three different versions,
    # and a run store inside the folder changed the folder's version on every call.
    ann = small_set(tmp_path / "set")
    runner = CliRunner()

    def cli(*target: str) -> str:
        res = runner.invoke(app, ["data", "hash", *target, "--json", "--store", str(tmp_path / "set" / "runs")])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)["version"]

    hash_dataset(tmp_path / "set", tmp_path / "set" / "runs" / "musubi.db")  # training made a store in the set
    folder = cli(str(tmp_path / "set"))
    assert cli(str(ann)) == folder == cli(f"{tmp_path / 'set' / 'images'}::{ann}")
    assert (tmp_path / "set" / "runs" / "musubi.db").is_file()  # the store sits inside the set ...
    (tmp_path / "set" / "images" / ".export.tmp").write_bytes(b"half")
    (tmp_path / "set" / "notes.part").write_bytes(b"half")
    assert cli(str(tmp_path / "set")) == folder  # ... and, like temp files, is no part of it
    # Moved elsewhere, the same bytes are the same version.
    shutil.copytree(tmp_path / "set", tmp_path / "moved", ignore=shutil.ignore_patterns("runs"))
    assert cli(str(tmp_path / "moved")) == folder
    config = {"name": "j", "data": {"train": {"path": str(tmp_path / "set" / "images"), "annotations": str(ann)},
                                    "val": {"path": str(tmp_path / "moved" / "images"),
                                            "annotations": str(tmp_path / "moved" / "annotations.json")}}}
    assert dataset_detail(config)["train"] == folder == dataset_detail(config)["val"]
    v = dataset_version(config)
    assert v is not None and v.startswith(folder + "+" + folder + "-")
    env = dataset_env([config])  # what env.json records
    assert env["datasets"] == {"j": v} and env["dataset_splits"]["j"]["train"] == folder


def test_a_missing_path_exits_2_naming_the_argument(tmp_path: Path) -> None:
    gone = str(tmp_path / "nope")
    for args, name in ((["data", "check", gone], "PATH"), (["data", "hash", gone], "PATH"),
                       (["data", "slice", gone, "--out", str(tmp_path / "o")], "SRC"),
                       (["data", "convert", gone, "--to", "yolo", "--out", str(tmp_path / "o")], "SRC"),
                       (["data", "convert", gone, "--to", "coco", "--out", str(tmp_path / "o.json")], "SRC")):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and f"{name} {gone}" in res.output, (args, res.output)
        assert len(res.output.strip().splitlines()) == 1


def test_a_folder_of_train_and_val_exports_hashes_both_splits(tmp_path: Path) -> None:
    # Both splits list frame_00000.jpg, in different image folders: each counts (no name collision).
    root = tmp_path / "set"
    for split, seed in (("train", 0), ("val", 1)):
        small_set(tmp_path / split, images=2, seed=seed)
        shutil.move(str(tmp_path / split / "images"), str(root / "images" / split))
        (root / "annotations").mkdir(parents=True, exist_ok=True)
        shutil.move(str(tmp_path / split / "annotations.json"), str(root / "annotations" / f"{split}.json"))
    first = hash_dataset(root)
    assert first.files == 6
    img = root / "images" / "val" / "frame_00000.jpg"
    img.write_bytes(img.read_bytes() + b"\0")
    assert hash_dataset(root).version != first.version
