"""Dataset versions: stable across runs and caches, changed by any byte or rename; recorded for runs."""

from __future__ import annotations

import os
from pathlib import Path

from typer.testing import CliRunner

from musubi.cli import app
from musubi.data.version import hash_dataset
from musubi.evaluate.provenance import dataset_version

from .sets import small_set


def test_stable_and_cached(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "set")
    store = tmp_path / "runs" / "musubi.db"
    first = hash_dataset(tmp_path / "set", store)
    assert first.hashed == first.files == 4 and first.version.startswith("data-")
    cached = hash_dataset(tmp_path / "set", store)
    assert cached.version == first.version and cached.hashed == 0
    assert hash_dataset(tmp_path / "set", None, workers=1).version == first.version  # no cache, one thread
    # The COCO file alone covers itself and the images it lists (another name space, another version).
    assert hash_dataset(ann, store).version != first.version and hash_dataset(ann, store).hashed == 0


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
    img.rename(img.with_name("renamed.jpg"))
    seen.add(hash_dataset(tmp_path / "set", store).version)
    (tmp_path / "set" / "extra.txt").write_text("x")
    seen.add(hash_dataset(tmp_path / "set", store).version)
    assert len(seen) == 5
    # Without the cache every byte is read: the same versions come back.
    assert hash_dataset(tmp_path / "set", None).version in seen


def test_cli_and_job_version(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "set")
    res = CliRunner().invoke(app, ["data", "hash", str(tmp_path / "set"), "--store", str(tmp_path / "runs")])
    assert res.exit_code == 0 and res.output.startswith("data-") and "4 files" in res.output
    assert (tmp_path / "runs" / "musubi.db").is_file()
    gone = CliRunner().invoke(app, ["data", "hash", str(tmp_path / "nope")])
    assert gone.exit_code == 2 and "no such file or directory" in gone.output
    config = {"data": {"train": {"path": str(tmp_path / "set" / "images"), "annotations": str(ann)},
                       "image_size": None}}
    v = dataset_version(config)
    assert v is not None and v.startswith("data-")
    assert dataset_version({"data": {**config["data"], "image_size": 320}}) != v  # options are part of it
    (tmp_path / "set" / "images" / "frame_00000.jpg").write_bytes(b"changed")
    assert dataset_version(config) != v
