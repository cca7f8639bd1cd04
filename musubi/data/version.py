"""Dataset version: a content hash of the annotations and every image byte.

The version is sha256 over (relative name, sha256 of the file) of every file,
sorted by name, so it changes with any byte, any rename and any added or removed
file, and never with the order the files were read in. Files are hashed on a
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

from musubi.config.errors import ConfigError
from musubi.store.hashcache import Key, lookup_digests, store_digests

#: Prefix of a content version (the registry also holds `synthetic-<sha>` for generated data).
PREFIX = "data-"
CHUNK = 1 << 20


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


def dataset_files(target: Path) -> list[tuple[str, Path]]:
    """(name recorded in the hash, file) of a dataset: every file under a folder, or a COCO file + its images."""
    target = Path(target)
    if target.is_dir():
        return sorted((p.relative_to(target).as_posix(), p) for p in target.rglob("*") if p.is_file())
    if not target.is_file():
        raise ConfigError(f"{target}: no such file or directory; give a dataset folder or a COCO JSON file")
    if target.suffix.lower() != ".json":
        return [(target.name, target)]
    from musubi.data.coco import check_relative_name, read_annotation_json
    from musubi.preflight.read.data import find_image_dir

    raw = read_annotation_json(target)
    names = [check_relative_name(img.get("file_name"), target, img.get("id")) for img in raw["images"]
             if isinstance(img, dict)]
    image_dir, _ = find_image_dir(target, names)
    if image_dir is None:
        raise ConfigError(f"{target}: cannot find its image directory; hash the dataset folder instead")
    missing = [n for n in names if not (image_dir / n).is_file()]
    if missing:
        raise ConfigError(f"{target}: {len(missing)} listed images are missing (first: {missing[0]!r}); "
                          "run `musubi data check` and fix the set")
    return [("annotations/" + target.name, target), *sorted(("images/" + n, image_dir / n) for n in set(names))]


def hash_dataset(target: Path, store: Path | None = None, workers: int | None = None) -> DatasetVersion:
    """The content version of a dataset folder or COCO file (see the module docstring)."""
    return hash_files(dataset_files(Path(target)), store, workers, str(target))


def hash_files(files: list[tuple[str, Path]], store: Path | None = None, workers: int | None = None,
               what: str = "dataset") -> DatasetVersion:
    """The content version of named files (name, path): sha256 over sorted (name, file digest)."""
    t0 = time.perf_counter()
    files = sorted(files)
    try:
        sums, hashed = digests([p for _, p in files], store, workers)
    except OSError as e:
        raise ConfigError(f"{what}: cannot read a file ({e}); fix its permissions") from None
    h = hashlib.sha256()
    for (name, _), d in zip(files, sums, strict=True):
        h.update(f"{name}\0{d}\n".encode())
    total = sum(p.stat().st_size for _, p in files)
    return DatasetVersion(PREFIX + h.hexdigest()[:16], len(files), total, hashed,
                          round(time.perf_counter() - t0, 3))
