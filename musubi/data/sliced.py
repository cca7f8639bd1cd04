"""Sliced COCO data: inline (a Dataset of tiles) and offline (`musubi data slice` writes tile files + COCO).

Inline, a frame is decoded once per visit and cut into its tiles; with the RAM
cache on, every tile of that frame is stored in one shared-memory uint8 buffer
created before the loader forks its workers, so each frame is decoded about once
per run instead of once per tile per epoch. With frames as file bytes (device
decode), a sample is a `FrameTile` (its frame's bytes and its window); the batch
carries each frame once (`EncodedTiles`) and the device decodes it once and cuts
its tiles (musubi.data.gpu_tiles).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from musubi.contract.errors import ConfigError
from musubi.data.coco import CocoDetection
from musubi.data.slicing import SliceParams, TileRef, Window, plan_tiles

log = logging.getLogger(__name__)

#: Share of the machine's available RAM the tile cache of all local ranks may take.
CACHE_RAM_SHARE = 0.5


def frame_sizes(ds: CocoDetection) -> list[tuple[int, int]]:
    """(width, height) per frame: declared in the annotations, else read from the file header."""
    out = []
    for name, (w, h) in zip(ds._file_names, ds._declared_sizes, strict=True):
        if w <= 0 or h <= 0:
            with Image.open(ds.image_dir / name) as im:  # header only, no decoding
                w, h = im.size
        out.append((w, h))
    return out


def frame_boxes(ds: CocoDetection) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per frame: boxes [N, 4] xyxy (float64) and labels [N] (contiguous 1..K)."""
    boxes, labels = [], []
    for i in range(len(ds)):
        lo, hi = int(ds._offsets[i]), int(ds._offsets[i + 1])
        boxes.append(ds._boxes[lo:hi].double().numpy())
        labels.append(ds._labels[lo:hi].numpy())
    return boxes, labels


def cache_fits(tiles: int, tile: int, local_ranks: int = 1) -> bool:
    """Whether `tiles` uint8 RGB tiles per rank fit the RAM budget and /dev/shm (where shared tensors live)."""
    import shutil

    import psutil

    need = tiles * tile * tile * 3 * max(1, local_ranks)
    try:
        shm_free = shutil.disk_usage("/dev/shm").free
    except OSError:
        shm_free = 0
    return need <= min(CACHE_RAM_SHARE * psutil.virtual_memory().available, CACHE_RAM_SHARE * shm_free)


def _check_shm(need: int) -> None:
    """ConfigError when /dev/shm cannot hold `need` bytes (a worker writing past it dies of SIGBUS)."""
    import shutil

    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return
    if need > free:
        raise ConfigError(f"data.cache: on needs {need / 2**30:.1f} GiB in /dev/shm, {free / 2**30:.1f} GiB free; "
                          "set data.cache: auto, or enlarge /dev/shm (docker --shm-size)")


def shared_buffer(nbytes: int) -> Tensor:
    """uint8 [nbytes] mapped shared from an unlinked /dev/shm file: forked loader workers write into the same
    pages, and pages are only committed when written (a zero-filled or copied buffer would commit them all)."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix="musubi-tiles-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.ftruncate(fd, nbytes)
        buf = torch.from_file(name, shared=True, size=nbytes, dtype=torch.uint8)
    finally:
        os.close(fd)
        os.unlink(name)  # the mapping outlives the name; the memory goes with the last process using it
    return buf


@dataclass(frozen=True)
class FrameTile:
    """A tile still inside its encoded frame: the frame's file bytes (uint8 [N]) and the window to cut."""

    source: str  # the annotation file: frame indices of two data sets never mix in a device cache
    frame: int
    data: Tensor
    window: Window


class EncodedTiles(NamedTuple):
    """A batch of tiles as encoded frames, each frame once: tile i is `windows[i]` of `frames[frame_of[i]]`."""

    source: str
    frames: list[Tensor]  # file bytes per distinct frame (pinned by the loader)
    frame_ids: list[int]  # the data set's frame index of each
    frame_of: list[int]
    windows: list[Window]


def group_tiles(tiles: list[FrameTile]) -> EncodedTiles:
    """FrameTiles of a batch -> EncodedTiles (each frame's bytes once, in order of first use)."""
    position: dict[int, int] = {}
    frames: list[Tensor] = []
    for t in tiles:
        if t.frame not in position:
            position[t.frame] = len(frames)
            frames.append(t.data)
    return EncodedTiles(tiles[0].source if tiles else "", frames, list(position), [position[t.frame] for t in tiles],
                        [t.window for t in tiles])


class SlicedCocoDetection(Dataset):
    """Tiles of a COCO set; index -> (tile [3, T, T] float in [0, 1] or uint8, target in tile pixels)."""

    def __init__(self, frames: CocoDetection, params: SliceParams, *, cache: bool | str = False,
                 as_uint8: bool = False) -> None:
        """Plan the tiles of `frames`; `cache`: True, False or "auto" (when cache_fits on this machine)."""
        if frames.image_size is not None:
            raise ConfigError("data.slice cuts frames at their own resolution; unset data.image_size "
                              "(the model input is the tile)")
        self.frames, self.params, self.as_uint8 = frames, params, as_uint8
        #: Frames as file bytes: samples are FrameTiles, cut on the device after one decode per frame.
        self.encoded = frames.encoded
        if self.encoded:
            cache = False  # the device decodes each frame once per visit; no decoded pixels in host RAM
        boxes, labels = frame_boxes(frames)
        self.tiles: list[TileRef]
        self.tiles, self.tiles_per_image = plan_tiles(frame_sizes(frames), boxes, labels, params)
        if not self.tiles:
            raise ConfigError(f"{frames.annotations}: slicing kept no tile; raise data.slice.empty_ratio")
        # Tiles of each frame, so a decode fills all of them into the cache at once.
        self._of_frame: dict[int, list[int]] = {}
        for n, t in enumerate(self.tiles):
            self._of_frame.setdefault(t.image, []).append(n)
        self.cache: Tensor | None = None
        self.cached: Tensor | None = None
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self._auto = cache == "auto"
        if cache == "auto":
            cache = cache_fits(len(self.tiles), params.tile, local_ranks)
        elif cache:
            _check_shm(len(self.tiles) * params.tile**2 * 3 * local_ranks)
        counts = [n for n in self.tiles_per_image if n]
        log.info("%s: %d frames -> %d tiles (%d..%d per frame), tile cache %s", frames.annotations, len(frames),
                 len(self.tiles), min(counts, default=0), max(counts, default=0), "on" if cache else "off")
        if not cache and counts and not self.encoded:
            log.warning("%s: tile cache off (%s): tiles are drawn frame by frame (frames shuffled, tiles shuffled "
                        "within each frame) so a worker decodes a frame about once per batch, not once per tile "
                        "(up to %dx more decoding); set data.cache: on, or free RAM / enlarge /dev/shm for auto",
                        frames.annotations, "auto: the tiles do not fit" if cache is False and self._auto else "off",
                        max(counts))
        #: The frame a worker decoded last (cache off): the next tiles of a batch come from it.
        self._last: tuple[int, np.ndarray] | None = None
        #: The frame a worker read last (encoded): its next tiles share the same bytes tensor.
        self._last_bytes: tuple[int, Tensor] | None = None
        if cache:
            t = params.tile
            self.cache = shared_buffer(len(self.tiles) * t * t * 3).view(len(self.tiles), t, t, 3)
            self.cached = torch.zeros(len(self.tiles), dtype=torch.uint8).share_memory_()

    @property
    def num_classes(self) -> int:
        """Object classes, background excluded."""
        return self.frames.num_classes

    @property
    def category_ids(self) -> tuple[int, ...]:
        """COCO category ids of the frames (label = position + 1)."""
        return self.frames.category_ids

    def __len__(self) -> int:
        return len(self.tiles)

    @property
    def frame_groups(self) -> list[list[int]] | None:
        """Tile indices per frame when the cache is off (the training sampler then draws frame by frame)."""
        return None if self.cache is not None else list(self._of_frame.values())

    def _pixels(self, index: int) -> np.ndarray:
        """uint8 [h, w, 3] of tile `index` (from the cache, or by decoding its frame)."""
        ref = self.tiles[index]
        x0, y0, x1, y1 = ref.window
        if self.cached is not None and self.cached[index]:
            assert self.cache is not None
            return self.cache[index, : y1 - y0, : x1 - x0].numpy()
        if self.cache is None and self._last is not None and self._last[0] == ref.image:
            return self._last[1][y0:y1, x0:x1]
        frame = np.asarray(self.frames._open(self.frames.image_dir / self.frames._file_names[ref.image]))
        if self.cache is None:
            self._last = (ref.image, frame)
        if self.cache is not None and self.cached is not None:
            for n in self._of_frame[ref.image]:
                a0, b0, a1, b1 = self.tiles[n].window
                self.cache[n, : b1 - b0, : a1 - a0].numpy()[...] = frame[b0:b1, a0:a1]
                self.cached[n] = 1
        return frame[y0:y1, x0:x1]

    def _frame_bytes(self, frame: int) -> Tensor:
        if self._last_bytes is None or self._last_bytes[0] != frame:
            self._last_bytes = (frame, self.frames.read_bytes(frame))
        return self._last_bytes[1]

    def __getitem__(self, index: int) -> tuple[Any, dict[str, Tensor]]:
        ref = self.tiles[index]
        if self.encoded:
            image: Any = FrameTile(str(self.frames.annotations), ref.image, self._frame_bytes(ref.image), ref.window)
            return image, self._target(index)
        # A copy: the frame's array is read-only (PIL) and the cache's pages are shared with other workers.
        pixels = self._pixels(index)
        t = self.params.tile
        if pixels.shape[0] < t or pixels.shape[1] < t:
            # A frame smaller than a tile (or its last row/column): padded right and below with zeros,
            # as `musubi data slice` writes it, so every sample is a full tile.
            padded = np.zeros((t, t, pixels.shape[2]), dtype=pixels.dtype)
            padded[: pixels.shape[0], : pixels.shape[1]] = pixels
            pixels = padded
        image = torch.from_numpy(np.array(pixels)).permute(2, 0, 1).contiguous()
        if not self.as_uint8:
            image = image.to(torch.float32).div_(255.0)
        return image, self._target(index)

    def _target(self, index: int) -> dict[str, Tensor]:
        ref = self.tiles[index]
        return {
            "boxes": torch.from_numpy(ref.boxes).to(torch.float32),
            "labels": torch.from_numpy(ref.labels),
            # Tiles are the samples: a unique id per tile keeps the metric's de-duplication right.
            "image_id": torch.tensor(index, dtype=torch.int64),
        }


@dataclass
class SliceReport:
    """What `slice_coco` wrote."""

    frames: int
    tiles: int
    boxes_in: int
    boxes_out: int
    tiles_per_image: dict[str, int] = field(default_factory=dict)
    annotations: str = ""

    @property
    def worst_case(self) -> int:
        """Most tiles any one frame gave."""
        return max(self.tiles_per_image.values(), default=0)


#: PIL format -> (tile suffix, save options): each frame's tiles keep its format, mode and bit depth.
#: JPEG stays JPEG (re-encoded at high quality: a crop of a JPEG cannot be written losslessly by PIL);
#: MPO is the JPEG drones and phones write. Any other format is written as PNG (lossless).
TILE_FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    "JPEG": (".jpg", {"format": "JPEG", "quality": 95}),
    "MPO": (".jpg", {"format": "JPEG", "quality": 95}),
    "PNG": (".png", {"format": "PNG"}),
    "TIFF": (".tif", {"format": "TIFF", "compression": "tiff_lzw"}),
}
LOSSLESS_FALLBACK = (".png", {"format": "PNG"})


def tile_format(path: Path) -> tuple[str, dict[str, Any]]:
    """(suffix, PIL save options) of the tiles of the frame at `path` (read from its header, not its name)."""
    with Image.open(path) as im:
        return TILE_FORMATS.get(str(im.format), LOSSLESS_FALLBACK)


def _write_frame_tiles(args: tuple[Path, Path, list[tuple[str, Window]], int]) -> tuple[str | None, str]:
    """Write one frame's tiles; (the reason it failed, e.g. a truncated JPEG, or None; the frame's sha256)."""
    src, out_dir, tiles, tile = args
    try:
        data = src.read_bytes()
        with Image.open(io.BytesIO(data)) as im:
            _, options = TILE_FORMATS.get(str(im.format), LOSSLESS_FALLBACK)
            im.load()  # the frame's own mode: 16-bit PNG stays I;16, grey stays L, RGBA stays RGBA
            frame = im if options["format"] != "JPEG" or im.mode in ("L", "RGB", "CMYK") else im.convert("RGB")
            for name, (x0, y0, _, _) in tiles:
                # PIL fills the part of a crop box outside the frame with zeros: a frame smaller than a tile
                # (or its last row/column) gives a full tile padded right and below, as SAHI pads.
                frame.crop((x0, y0, x0 + tile, y0 + tile)).save(out_dir / name, **options)
    except Exception as e:  # noqa: BLE001 - every frame's failure is collected and reported together
        return f"{src.name} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})", ""
    return None, hashlib.sha256(data).hexdigest()


def tile_name(file_name: str, image_id: int, x0: int, y0: int, suffix: str = ".jpg") -> str:
    """`<frame id>_<stem>_<x0>_<y0><suffix>`: unique per frame (x.jpg and x.png, a/b.jpg and a__b.jpg differ)."""
    stem = Path(file_name).with_suffix("").as_posix().replace("/", "__")
    return f"{image_id}_{stem}_{x0}_{y0}{suffix}"


def slice_coco(annotations: Path, image_dir: Path, out: Path, params: SliceParams,
               workers: int | None = None) -> SliceReport:
    """Cut every frame into tiles: OUT/images/<id>_<stem>_<x0>_<y0>.<frame's format> and OUT/annotations.json.

    Every tile is tile x tile pixels (padded with zeros right and below where the frame ends) in its
    frame's format, mode and bit depth. Each tile's image entry records its source frame (`frame_id`,
    `frame_file`, `frame_sha256`) and `window` (the frame pixels it holds), so `data check` and
    `data split` keep the tiles of one frame together. Everything is written into a hidden sibling
    folder that becomes OUT only when every frame was cut: a frame that does not decode leaves nothing
    behind (ConfigError listing every such frame), so a rerun after fixing it is not refused.
    """
    frames = CocoDetection(image_dir, annotations)
    boxes, labels = frame_boxes(frames)
    tiles, per_image = plan_tiles(frame_sizes(frames), boxes, labels, params)
    final = Path(out)
    out = final.parent / f".{final.name}.partial-{os.getpid()}"
    if out.exists():
        shutil.rmtree(out)
    (out / "images").mkdir(parents=True)
    try:
        report = _slice_into(frames, tiles, per_image, Path(annotations), Path(image_dir), out, params.tile,
                             workers)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    if final.exists():
        final.rmdir()  # checked empty by the caller; rmdir refuses otherwise (nothing is overwritten)
    out.rename(final)
    report.annotations = str(final / "annotations.json")
    return report


def _slice_into(frames: CocoDetection, tiles: list[TileRef], per_image: list[int], annotations: Path,
                image_dir: Path, out: Path, tile: int, workers: int | None) -> SliceReport:
    raw = json.loads(Path(annotations).read_text(encoding="utf-8"))
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    jobs: dict[int, list[tuple[str, Window]]] = {}
    entries_of: dict[int, list[dict[str, Any]]] = {}
    suffix_of: dict[int, str] = {}
    for ref in tiles:
        x0, y0, x1, y1 = ref.window
        if ref.image not in suffix_of:
            try:
                suffix_of[ref.image] = tile_format(image_dir / frames._file_names[ref.image])[0]
            except Exception:  # noqa: BLE001 - the writer below names the frame that does not open
                suffix_of[ref.image] = LOSSLESS_FALLBACK[0]
        name = tile_name(frames._file_names[ref.image], frames._image_ids[ref.image], x0, y0, suffix_of[ref.image])
        image_id = len(images) + 1
        entry = {"id": image_id, "file_name": name, "width": tile, "height": tile,
                 "frame_id": frames._image_ids[ref.image], "frame_file": frames._file_names[ref.image],
                 "window": [x0, y0, x1, y1]}
        images.append(entry)
        entries_of.setdefault(ref.image, []).append(entry)
        for b, lab in zip(ref.boxes.tolist(), ref.labels.tolist(), strict=True):
            w, h = b[2] - b[0], b[3] - b[1]
            anns.append({"id": len(anns) + 1, "image_id": image_id,
                         "category_id": frames.category_ids[int(lab) - 1],
                         "bbox": [b[0], b[1], w, h], "area": w * h, "iscrowd": 0})
        jobs.setdefault(ref.image, []).append((name, ref.window))
    args = [(image_dir / frames._file_names[i], out / "images", t, tile) for i, t in jobs.items()]
    # PIL releases the GIL while decoding and encoding: threads are enough and share nothing.
    with ThreadPoolExecutor(max_workers=workers or min(16, os.cpu_count() or 1)) as pool:
        results = list(pool.map(_write_frame_tiles, args))
    failed = [f for f, _ in results if f]
    if failed:
        raise ConfigError(f"{annotations}: {len(failed)} frames do not decode ({'; '.join(failed[:5])}"
                          f"{'; ...' if len(failed) > 5 else ''}); nothing written: run `musubi data check` "
                          "and fix or remove them")
    for i, (_, sha) in zip(jobs, results, strict=True):
        for entry in entries_of[i]:
            entry["frame_sha256"] = sha
    ann_out = out / "annotations.json"
    ann_out.write_text(json.dumps({"images": images, "annotations": anns, "categories": raw["categories"]}),
                       encoding="utf-8")
    return SliceReport(frames=len(frames), tiles=len(tiles), boxes_in=frames.stats.boxes, boxes_out=len(anns),
                       tiles_per_image={frames._file_names[i]: n for i, n in enumerate(per_image)},
                       annotations=str(ann_out))
