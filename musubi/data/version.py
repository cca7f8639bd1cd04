"""Dataset version: a content hash of the annotations and every image byte.

The version is sha256 over (name, sha256 of the file) of every file of the set,
sorted by name, so it changes with any byte, any rename and any added or removed
file, and never with the order the files were read in. Which files and names:
see dataset_files (a COCO split is its annotation file plus the images it lists,
wherever they sit; a folder's run store, hidden and temporary files never count). Files are hashed on a
thread pool (hashlib releases the GIL on large buffers) and their digests cached
in the store (`musubi.db`) by path, size and mtime, so a new export of a large set
re-reads only what changed.
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from musubi.contract.errors import ConfigError
from musubi.data.layout import find_image_dir, folder_layout
from musubi.store.hashcache import Key, lookup_digests, store_digests

#: Prefix of a content version (the registry also holds `synthetic-<sha>` for generated data).
PREFIX = "data-"
CHUNK = 1 << 20


class DataChanged(ConfigError):
    """A file vanished or changed while the set was hashed (retry later)."""


@dataclass(frozen=True)
class DatasetVersion:
    """A version and what it covered."""

    version: str
    files: int
    bytes: int
    hashed: int  # files read this time (the rest came from the cache)
    seconds: float

    def as_dict(self) -> dict[str, object]:
        """JSON form (env.json, --json)."""
        return {"version": self.version, "files": self.files, "bytes": self.bytes, "hashed": self.hashed,
                "seconds": self.seconds}


def file_digest(path: Path) -> str:
    """Hex sha256 of one file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def digests(paths: list[Path], store: Path | None = None, workers: int | None = None) -> tuple[list[str], int]:
    """sha256 per path (cached in `store` by path+size+mtime) and how many files were actually read."""
    keys: list[Key] = []
    for p in paths:
        st = p.stat()
        keys.append((str(p.resolve()), st.st_size, st.st_mtime_ns))
    cached = lookup_digests(store, keys) if store is not None else {}
    todo = [(k, p) for k, p in zip(keys, paths, strict=True) if k[0] not in cached]
    if todo:
        n = workers or min(16, (os.cpu_count() or 1) * 2)
        if len(todo) > 4 and n > 1:
            with ThreadPoolExecutor(max_workers=n) as pool:
                fresh = list(pool.map(file_digest, [p for _, p in todo]))
        else:
            fresh = [file_digest(p) for _, p in todo]
        new = [(k, d) for (k, _), d in zip(todo, fresh, strict=True)]
        cached.update({k[0]: d for k, d in new})
        if store is not None:
            store_digests(store, new)
    return [cached[k[0]] for k in keys], len(todo)


#: File name endings of exports in progress and editor/OS leftovers: never part of a version.
TEMP_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", ".swp", "~")
#: The run store: a folder holding it (runs/) is output of training, never input.
STORE_NAME = "musubi.db"


def _skipped(name: str) -> bool:
    return name.startswith(".") or name.endswith(TEMP_SUFFIXES) or name.startswith(STORE_NAME)


def data_files(root: Path) -> list[tuple[str, Path]]:
    """(relative name, file) of every data file under a folder.

    Skipped: hidden files and folders, temporary files (TEMP_SUFFIXES), the run store (`musubi.db*`)
    and any folder holding one (a `runs/` inside the set), so training next to the data never changes
    its version. A file that vanishes while listing is simply not listed.
    """
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        d = Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames if not _skipped(n) and not (d / n / STORE_NAME).exists())
        for n in filenames:
            if not _skipped(n) and (d / n).is_file():
                out.append(((d / n).relative_to(root).as_posix(), d / n))
    return sorted(out)


def coco_files(ann: Path, image_dir: Path | None = None, name: str = "annotations") -> list[tuple[str, Path]]:
    """(name, file) of a COCO split: the annotation file as `name` and every listed image as images/<file_name>.

    The one definition of a COCO split's content: `data hash ANN.json`, `data hash DIR` (a folder with
    one annotation JSON) and the version recorded for a job reading IMAGES_DIR + ANN.json all use it,
    so the same bytes give the same version wherever the files sit and whatever they are called.
    """
    from musubi.data.coco_file import check_relative_name, read_annotation_json

    raw = read_annotation_json(ann)
    names = [check_relative_name(img.get("file_name"), ann, img.get("id")) for img in raw["images"]
             if isinstance(img, dict)]
    if image_dir is None:
        image_dir, _ = find_image_dir(ann, names)
        if image_dir is None:
            raise ConfigError(f"{ann}: cannot find its image directory; give IMAGES_DIR::ANN.json")
    missing = [n for n in names if not (image_dir / n).is_file()]
    if missing:
        raise ConfigError(f"{ann}: {len(missing)} listed images are missing (first: {missing[0]!r}); "
                          "run `musubi data check` and fix the set")
    return [(name, ann), *sorted(("images/" + n, image_dir / n) for n in set(names))]


def dataset_files(target: Path, image_dir: Path | None = None) -> list[tuple[str, Path]]:
    """(name recorded in the hash, file) of a data set.

    A COCO file (or IMAGES_DIR + ANN.json, or a folder with one annotation JSON): the annotation file
    and the images it lists (coco_files). A folder with several annotation JSONs (train/val exports):
    each JSON by its relative name plus the images they list. Any other folder (image classes, YOLO):
    its data files (data_files). Any other file: itself.
    """
    target = Path(target)
    if target.is_dir():
        layout, jsons = folder_layout(target, several=True)
        if layout != "coco":
            return data_files(target)
        if len(jsons) == 1:
            return coco_files(jsons[0])
        # Splits may list the same file_name in different image folders: images are named by their path
        # under the folder here (or after their annotation file when they lie outside it).
        files: dict[str, Path] = {}
        for ann in jsons:
            rel = f"annotations/{ann.relative_to(target).as_posix()}"
            for name, path in coco_files(ann, name=rel):
                if path == ann:
                    files[name] = path
                elif path.resolve().is_relative_to(target.resolve()):
                    files[path.resolve().relative_to(target.resolve()).as_posix()] = path
                else:
                    files[f"{rel}/{name}"] = path
        return sorted(files.items())
    if not target.is_file():
        raise ConfigError(f"{target}: no such file or directory; give a dataset folder or a COCO JSON file")
    if target.suffix.lower() == ".json":
        return coco_files(target, image_dir)
    return [("file", target)]


def hash_dataset(target: Path, store: Path | None = None, workers: int | None = None,
                 image_dir: Path | None = None) -> DatasetVersion:
    """The content version of a dataset folder or COCO file (see dataset_files)."""
    return hash_files(dataset_files(Path(target), image_dir), store, workers, str(target))


def hash_files(files: list[tuple[str, Path]], store: Path | None = None, workers: int | None = None,
               what: str = "dataset") -> DatasetVersion:
    """The content version of named files (name, path): sha256 over sorted (name, file digest)."""
    t0 = time.perf_counter()
    files = sorted(files)
    try:
        sums, hashed = digests([p for _, p in files], store, workers)
        total = sum(p.stat().st_size for _, p in files)
    except FileNotFoundError as e:
        raise DataChanged(f"{what}: {e.filename} vanished while hashing (an export in progress?); "
                          "hash again once it is written") from None
    except OSError as e:
        raise ConfigError(f"{what}: cannot read a file ({e}); fix its permissions") from None
    h = hashlib.sha256()
    for (name, _), d in zip(files, sums, strict=True):
        h.update(f"{name}\0{d}\n".encode())
    return DatasetVersion(PREFIX + h.hexdigest()[:16], len(files), total, hashed,
                          round(time.perf_counter() - t0, 3))
