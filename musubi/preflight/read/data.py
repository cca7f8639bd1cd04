"""Dataset readings: COCO (through musubi.data.coco), image folders and text files, every image decoded.

A `--data` target is one string: `ANN.json` (COCO; the image directory is
found beside it), `IMAGES_DIR::ANN.json` (COCO, explicit), a directory (an
image folder, one sub-folder per class) or any other file (UTF-8 text).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError, split_error
from musubi.data.coco_scan import BLOCKING, is_int, json_key, scan_entries, scan_references
from musubi.data.layout import PAIR_SEPARATOR, find_image_dir, folder_layout
from musubi.data.version import digests
from musubi.preflight.readings import DataIssue, DataReading

#: Offending files named per problem kind.
MAX_EXAMPLES = 3
#: A box may overhang its image by this much (pixels) before it counts as outside (rounding in exports).
BOX_TOLERANCE_PX = 1.0


#: EXIF tag of the orientation a viewer applies (1: as stored).
EXIF_ORIENTATION = 0x0112


class Rotated(tuple):  # type: ignore[type-arg]
    """(width, height) of an image whose EXIF orientation a viewer applies but training does not."""

    orientation: int


def decode_image(path: Path) -> tuple[int, int]:
    """Decode an image fully (JPEG at 1/8 scale: every byte is still read) and return (width, height).

    The size is the stored one (what the loader sees); when the EXIF orientation is not 1 the result
    is a `Rotated` tuple carrying it (viewers and labelling tools show the image turned).
    """
    from PIL import Image

    from musubi.data.coco import DEFAULT_MAX_IMAGE_PIXELS

    limit = Image.MAX_IMAGE_PIXELS or DEFAULT_MAX_IMAGE_PIXELS
    with Image.open(path) as im:
        w, h = im.size
        try:
            orientation = int(im.getexif().get(EXIF_ORIENTATION, 1) or 1)
        except Exception:  # noqa: BLE001 - a broken EXIF block is not a decode failure
            orientation = 1
        if w * h > limit:
            raise ValueError(f"{w}x{h} pixels, over the {limit} pixel limit")
        if im.format == "JPEG":
            # Draft mode skips most of the IDCT work but still reads every entropy-coded byte,
            # so a truncated or corrupt file fails here exactly as in training, ~5x faster.
            im.draft("RGB", (max(1, w // 8), max(1, h // 8)))
        im.load()
    if orientation != 1:
        out = Rotated((w, h))
        out.orientation = orientation
        return out
    return w, h


def _decode_all(paths: list[Path]) -> list[tuple[int, int] | str]:
    """(width, height) or the reason it failed, per path, decoded on a thread pool (PIL frees the GIL)."""

    def one(p: Path) -> tuple[int, int] | str:
        try:
            return decode_image(p)
        except Exception as e:  # noqa: BLE001 - every decoder failure is a finding, recorded with its reason
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")

    if len(paths) < 32:
        return [one(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        return list(pool.map(one, paths))


def _issue(kind: str, examples: list[str], count: int | None = None, keep: int = MAX_EXAMPLES) -> DataIssue:
    return DataIssue(kind=kind, count=len(examples) if count is None else count, examples=tuple(examples[:keep]))


def _issues(found: dict[str, list[str]], keep: int = MAX_EXAMPLES) -> tuple[DataIssue, ...]:
    return tuple(_issue(kind, ex, keep=keep) for kind, ex in found.items() if ex)


def data_targets(data: Any) -> list[str]:
    """`--data` targets of a job's on-disk splits (a config DataSpec), train first; [] for synthetic data."""
    out = []
    for split in (getattr(data, "train", None), getattr(data, "val", None)):
        if split is not None:
            out.append(f"{split.path}{PAIR_SEPARATOR}{split.annotations}" if split.annotations else split.path)
    return out


def read_data(target: str, examples: int = MAX_EXAMPLES, store: Path | None = None) -> DataReading:
    """Read one `--data` target into a reading (never raises for a bad dataset).

    `examples`: offenders named per problem kind; `store`: musubi.db caching image digests (COCO).
    The seconds reported are the reading's own, not importing torch (done first).
    """
    import musubi.data.coco  # noqa: F401 - imports torch: outside the measured time

    t0 = time.perf_counter()
    if PAIR_SEPARATOR in target:
        a, b = (Path(p) for p in target.split(PAIR_SEPARATOR, 1))
        ann, images = (b, a) if b.suffix.lower() == ".json" else (a, b)
        reading = read_coco(target, ann, images, examples, store)
    else:
        path = Path(target)
        layout, found = "folder", []
        if path.is_dir():
            try:
                layout, found = folder_layout(path)
            except ConfigError as e:
                problem, fix = split_error(str(e))
                return DataReading(target=target, kind="ambiguous", path=target, error=problem, fix=fix)
        if not path.exists():
            reading = DataReading(target=target, kind="missing", path=target,
                                  error=f"{target}: no such file or directory",
                                  fix="give an existing PATH (ANN.json, IMAGES_DIR::ANN.json, a folder or a file)")
        elif layout == "coco":
            reading = read_coco(target, found[0], None, examples, store)
        elif layout == "yolo":
            reading = DataReading(target=target, kind="yolo", path=target,
                                  error=f"{target}: a YOLO folder ({found[0].name}); the check reads COCO",
                                  fix=f"run `musubi data convert {target} --to coco --out ANN.json` and check that")
        elif path.is_dir():
            reading = read_image_folder(target, path)
        elif path.suffix.lower() == ".json":
            reading = read_coco(target, path, None, examples, store)
        else:
            reading = read_text(target, path)
    return dataclasses.replace(reading, seconds=round(time.perf_counter() - t0, 3))


def _size_counts(sizes: dict[str, int]) -> list[int]:
    """How many files have each file's size (in the dict's order)."""
    from collections import Counter

    count = Counter(sizes.values())
    return [count[v] for v in sizes.values()]



def read_coco(target: str, ann: Path, image_dir: Path | None, examples: int = MAX_EXAMPLES,
              store: Path | None = None) -> DataReading:
    """A COCO set: ids and references, the structural check of musubi.data.coco, then every image and box."""
    from musubi.data.coco import CocoDetection, check_relative_name, read_annotation_json
    base = {"target": target, "kind": "coco", "path": str(ann)}
    try:
        raw = read_annotation_json(ann)
    except ConfigError as e:
        problem, fix = split_error(str(e))
        return DataReading(**base, image_dir=str(image_dir) if image_dir else None, error=problem, fix=fix)
    names = [img.get("file_name") for img in raw["images"] if isinstance(img, dict)]
    if image_dir is None:
        image_dir, tried = find_image_dir(ann, (n for n in names if isinstance(n, str)))
        if image_dir is None:
            where = ", ".join(str(t) for t in tried[:4])
            return DataReading(**base, error=f"{ann}: cannot find the image directory (looked in {where})",
                               fix=f"give --data IMAGES_DIR{PAIR_SEPARATOR}{ann}")
    base["image_dir"] = str(image_dir)
    original = raw
    index_of = {id(a): n for n, a in enumerate(original["annotations"])}
    malformed, raw = scan_entries(raw, ann)
    found = {**malformed, **scan_references(raw, index_of)}
    try:
        if any(found[k] for k in BLOCKING):
            # Listed one by one already; the loader's own rules still run on the remaining entries.
            by_id = {json_key(i.get("id")): i for i in raw["images"] if isinstance(i, dict)}
            cats = {json_key(c.get("id")) for c in raw["categories"] if isinstance(c, dict)}
            raw_ok = {**raw, "images": list(by_id.values()),
                      "annotations": [a for a in raw["annotations"] if not isinstance(a, dict) or
                                      (json_key(a.get("image_id")) in by_id and json_key(a.get("category_id")) in cats)]}
        else:
            raw_ok = raw
        # The exact code a training rank runs: if this passes, the loader's construction will too
        # (it parses the file a second time: the price of not keeping a copy of its rules here).
        ds = CocoDetection(image_dir, ann, check_files=False, raw=raw_ok)
    except ConfigError as e:
        problem, fix = split_error(str(e))
        return DataReading(**base, error=problem, fix=fix, issues=_issues(found, examples))
    images: list[dict[str, Any]] = [img for img in raw["images"] if isinstance(img, dict)]
    files = [check_relative_name(img.get("file_name"), ann, img.get("id")) for img in images]
    paths = [image_dir / f for f in files]
    exists = [p.is_file() for p in paths]
    for k in ("missing", "undecodable", "exif_rotated", "duplicate_image", "size_mismatch", "empty_box",
              "box_outside"):
        found[k] = []
    found["missing"] = [f for f, ok in zip(files, exists, strict=True) if not ok]
    decoded = _decode_all([p for p, ok in zip(paths, exists, strict=True) if ok])
    size_of: dict[Any, tuple[float, float]] = {}
    it = iter(decoded)
    readable: list[tuple[str, Path]] = []
    for img, name, path, ok in zip(images, files, paths, exists, strict=True):
        # Non-integer or missing sizes mean "unknown" to musubi.data.coco too.
        declared = tuple(v if is_int(v) else 0 for v in (img.get("width"), img.get("height")))
        if not ok:
            if declared[0] and declared[1]:
                size_of[img["id"]] = declared
            continue
        got = next(it)
        if isinstance(got, str):
            found["undecodable"].append(f"{name} ({got})")
            continue
        readable.append((name, path))
        size_of[img["id"]] = got
        if isinstance(got, Rotated):
            found["exif_rotated"].append(f"{name} (EXIF orientation {got.orientation}, stored {got[0]}x{got[1]})")
        if declared[0] and declared[1] and tuple(declared) != got:
            found["size_mismatch"].append(f"{name} (declared {declared[0]}x{declared[1]}, is {got[0]}x{got[1]})")
    # Identical bytes under two names: the same frame twice (or in two splits) skews training and scores.
    # Only files that share their size with another can be copies: hash just those.
    unique = dict(readable)
    sizes = {name: path.stat().st_size for name, path in unique.items()}
    shared = [n for n, c in zip(unique, _size_counts(sizes), strict=True) if c > 1]
    sums, _ = digests([unique[n] for n in shared], store)
    first_of: dict[str, str] = {}
    for name, digest in zip(shared, sums, strict=True):
        if digest in first_of:
            found["duplicate_image"].append(f"{name} = {first_of[digest]}")
        else:
            first_of[digest] = name
    file_of = {img["id"]: name for img, name in zip(images, files, strict=True)}
    known = set(ds.category_ids)
    # Keyed by name as before; two categories of one name are told apart by id (never merged).
    name_count: dict[str, int] = {}
    for c in ds.category_ids:
        name_count[ds.category_names[c]] = name_count.get(ds.category_names[c], 0) + 1
    label = {c: ds.category_names[c] if name_count[ds.category_names[c]] == 1 else f"{ds.category_names[c]} (id {c})"
             for c in ds.category_ids}
    found["duplicate_category_name"] = [f"{n!r} (ids {', '.join(str(c) for c in ds.category_ids if ds.category_names[c] == n)})"
                                        for n, k in name_count.items() if k > 1]
    found["duplicate_box"] = []
    per_class = {label[c]: 0 for c in ds.category_ids}
    crowd = 0
    boxed: set[Any] = set()
    first_box: dict[tuple[Any, ...], int] = {}
    for a in raw["annotations"]:
        n = index_of[id(a)]
        if json_key(a.get("image_id")) not in file_of or json_key(a.get("category_id")) not in known:
            continue  # listed as unknown_image / unknown_category
        x, y, w, h = (float(v) for v in a["bbox"])
        where = f"{file_of[a['image_id']]} (annotations[{n}] bbox [{x:g}, {y:g}, {w:g}, {h:g}])"
        size = size_of.get(a["image_id"])
        tol = BOX_TOLERANCE_PX
        outside = bool(size) and (x < -tol or y < -tol or x + w > size[0] + tol or y + h > size[1] + tol)
        if a.get("iscrowd", 0):
            crowd += 1
            if outside:  # a crowd region is not trained on, but evaluation ignores detections by it
                found["box_outside"].append(f"{where} (crowd) in {size[0]}x{size[1]}")
            continue
        per_class[label[a["category_id"]]] += 1
        boxed.add(a["image_id"])
        same = (a["image_id"], a["category_id"], x, y, w, h)
        if same in first_box:
            found["duplicate_box"].append(f"{where} = annotations[{first_box[same]}]")
        else:
            first_box[same] = n
        if not all(math.isfinite(v) for v in (x, y, w, h)) or w <= 0 or h <= 0:
            found["empty_box"].append(where)
            continue
        if outside:
            found["box_outside"].append(f"{where} in {size[0]}x{size[1]}")
    pixels = _single_channel_stats(readable, found)
    # Unused categories are common (a val subset) and only reported: a count here, named by `data check`.
    counts = {"images": len(original["images"]), "annotations": len(original["annotations"]), "boxes": ds.stats.boxes,
              "categories": ds.num_classes, "crowd": crowd,
              "unused_categories": sum(v == 0 for v in per_class.values()),
              "images_without_boxes": sum(img["id"] not in boxed for img in images)}
    return DataReading(**base, counts=counts, issues=_issues(found, examples), per_class=per_class,
                       categories=tuple(ds.category_names[c] for c in ds.category_ids), pixels=pixels)


def _single_channel_stats(readable: list[tuple[str, Path]], found: dict[str, list[str]]) -> dict[str, Any] | None:
    """Pixel statistics of a set of single-channel frames (thermal, greyscale), as training reads them with
    data.channels 1; None for RGB sets. A multi-channel image among single-channel ones is a finding."""
    from PIL import Image

    from musubi.data.pixels import pixel_stats
    from musubi.data.single_channel import SINGLE_CHANNEL_MODES

    modes = {}
    for name, path in readable:
        with Image.open(path) as im:
            modes[name] = im.mode
    single = [(n, p) for n, p in readable if modes[n] in SINGLE_CHANNEL_MODES]
    if not single or len(single) < len(readable) / 2:
        return None  # an RGB set (a few grey frames in it are read as RGB by training)
    found["mixed_channels"] = [f"{n} (mode {modes[n]})" for n, _ in readable if modes[n] not in SINGLE_CHANNEL_MODES]
    return pixel_stats([p for _, p in single]).as_dict()


def _split_images(reading: DataReading) -> list[Path]:
    """The image files of a reading that parsed (COCO: listed and present; image folder: every image)."""
    if reading.error is not None or reading.kind not in ("coco", "image_folder"):
        return []
    if reading.kind == "image_folder":
        from torchvision.datasets.folder import IMG_EXTENSIONS

        return sorted(p for p in Path(reading.path).rglob("*") if p.suffix.lower() in IMG_EXTENSIONS and p.is_file())
    from musubi.data.coco import read_annotation_json

    raw = read_annotation_json(Path(reading.path))
    root = Path(str(reading.image_dir))
    names = {img.get("file_name") for img in raw["images"] if isinstance(img, dict)}
    return sorted(root / n for n in names if isinstance(n, str) and (root / n).is_file())


def across_splits(readings: list[DataReading], store: Path | None = None) -> list[str]:
    """Images whose bytes appear in two splits ('val/x.jpg = train/y.jpg'): only same-size files are hashed."""
    files = [(r.path, p) for r in readings for p in _split_images(r)]
    sizes: dict[int, set[str]] = {}
    for split, p in files:
        sizes.setdefault(p.stat().st_size, set()).add(split)
    shared = [(split, p) for split, p in files if len(sizes[p.stat().st_size]) > 1]
    sums, _ = digests([p for _, p in shared], store)
    first: dict[str, tuple[str, Path]] = {}
    out = []
    for (split, p), d in zip(shared, sums, strict=True):
        if d in first and first[d][0] != split:
            out.append(f"{p} ({split}) = {first[d][1]} ({first[d][0]})")
        first.setdefault(d, (split, p))
    return out


def read_image_folder(target: str, root: Path) -> DataReading:
    """An image folder (ROOT/CLASS/image): classes as torchvision's ImageFolder finds them, every image decoded."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, has_file_allowed_extension

    base = {"target": target, "kind": "image_folder", "path": str(root)}
    try:
        classes = find_classes(str(root))[0]
    except FileNotFoundError:
        jsons = sorted(root.glob("*.json"))
        hint = f"; for COCO give --data {jsons[0]}" if jsons else ""
        return DataReading(**base, error=f"{root}: no class folders inside",
                           fix=f"expected ROOT/CLASS/image.jpg{hint}")
    per_class: dict[str, list[Path]] = {}
    for c in classes:
        # The walk ImageFolder does: follow links, keep files with an image extension.
        files = []
        for dirpath, _, names in sorted(os.walk(root / c, followlinks=True)):
            files += [Path(dirpath) / n for n in sorted(names) if has_file_allowed_extension(n, IMG_EXTENSIONS)]
        per_class[c] = files
    paths = [p for files in per_class.values() for p in files]
    decoded = _decode_all(paths)
    found = {
        "empty_class": [f"{root / c}" for c, files in per_class.items() if not files],
        "undecodable": [f"{p.relative_to(root)} ({got})" for p, got in zip(paths, decoded, strict=True) if isinstance(got, str)],
    }
    return DataReading(**base, counts={"classes": len(classes), "images": len(paths)}, issues=_issues(found),
                       categories=tuple(classes))


def read_text(target: str, path: Path) -> DataReading:
    """A byte-level text file: size bounds and UTF-8 validity, as musubi.data.text checks them."""
    from musubi.data.text import MAX_TEXT_BYTES, check_utf8

    base = {"target": target, "kind": "text", "path": str(path)}
    size = path.stat().st_size
    if size == 0:
        return DataReading(**base, counts={"bytes": 0}, error=f"{path}: empty file", fix="give a non-empty text file")
    if size > MAX_TEXT_BYTES:
        return DataReading(**base, counts={"bytes": size},
                           error=f"{path}: {size} bytes, over the {MAX_TEXT_BYTES}-byte limit",
                           fix="split or tokenise it offline")
    try:
        check_utf8(path)
    except ConfigError as e:
        problem, fix = split_error(str(e))
        return DataReading(**base, counts={"bytes": size}, error=problem, fix=fix)
    except OSError as e:
        return DataReading(**base, counts={"bytes": size}, error=f"{path}: cannot read ({e.strerror or e})",
                           fix="fix its permissions or --data")
    return DataReading(**base, counts={"bytes": size})
