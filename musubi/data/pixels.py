"""The pixel statistics of a set of single-channel frames (read by musubi.data.single_channel).

The statistics (mean, std, min, max over every pixel of a split) are a function of the split's
content, so they are kept per content version (`data-…`) in musubi.db and computed once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from musubi.contract.errors import ConfigError
from musubi.data.single_channel import read_single_channel
from musubi.data.version import coco_files, hash_files
from musubi.store.pixelcache import lookup_pixel_stats, store_pixel_stats


@dataclass(frozen=True)
class PixelStats:
    """Statistics of every pixel of a split (raw units: counts or kelvin, as stored)."""

    images: int
    pixels: int
    dtype: str  # numpy dtype of the frames ("uint16"; several: joined by "+")
    mean: float
    std: float
    min: float
    max: float

    def as_dict(self) -> dict[str, Any]:
        """JSON form (musubi.db, `data hash --json`, `data check --json`)."""
        return asdict(self)

    def line(self) -> str:
        """One human line: `12 frames, uint16, mean 7512.3, std 812.4, range 6020..11980`."""
        return (f"{self.images} frames, {self.dtype}, mean {self.mean:.6g}, std {self.std:.6g}, "
                f"range {self.min:g}..{self.max:g}")


def pixel_stats(paths: list[Path], max_pixels: int | None = None) -> PixelStats:
    """Statistics over every pixel of the single-channel images at `paths`, each decoded once.

    Per frame: count, mean and sum of squared deviations in float64; frames are merged with Chan's
    pairwise update, so the variance carries no catastrophic cancellation (16-bit frames of
    millions of pixels, mean ~7500: the naive sum-of-squares formula loses digits).
    """
    if not paths:
        raise ConfigError("pixel statistics: the split lists no images; add images to it")
    n, mean, m2 = 0, 0.0, 0.0
    lo, hi = math.inf, -math.inf
    dtypes: list[str] = []
    for p in paths:
        raw = read_single_channel(p, max_pixels)
        if raw.dtype.name not in dtypes:
            dtypes.append(raw.dtype.name)
        a = raw.astype(np.float64).ravel()
        k, a_mean = a.size, float(a.mean())
        a_m2 = float(((a - a_mean) ** 2).sum())
        delta = a_mean - mean
        total = n + k
        mean += delta * k / total
        m2 += a_m2 + delta * delta * n * k / total
        n = total
        lo, hi = min(lo, float(a.min())), max(hi, float(a.max()))
    return PixelStats(len(paths), n, "+".join(dtypes), mean, math.sqrt(m2 / n), lo, hi)


def split_pixel_stats(annotations: Path, image_dir: Path, store: Path | None = None,
                      max_pixels: int | None = None) -> tuple[str, PixelStats]:
    """(content version, statistics) of a COCO split: read from `store` (musubi.db) by version, else computed
    over every image it lists and recorded there."""
    files = coco_files(Path(annotations), Path(image_dir))
    version = hash_files(files, store, what=str(annotations)).version
    cached = lookup_pixel_stats(store, version)
    if cached is not None:
        try:
            return version, PixelStats(**cached)
        except TypeError:
            pass  # recorded by another layout of PixelStats: compute again
    stats = pixel_stats([p for name, p in files if name.startswith("images/")], max_pixels)
    store_pixel_stats(store, version, stats.as_dict())
    return version, stats


def fill_normalization(data: Any, store: Path | None = None) -> bool:
    """Set `data.normalize` (a config DataSpec) from the train split's statistics when single-channel frames
    have none; True when it was filled. The values land in the resolved config (job.json)."""
    if data.channels != 1 or data.normalize is not None or data.train is None or data.train.annotations is None:
        return False
    version, stats = split_pixel_stats(Path(data.train.annotations), Path(data.train.path), store,
                                       data.max_image_pixels)
    data.normalize = {"mean": stats.mean, "std": stats.std or 1.0,
                      "source": f"train split {version}: {stats.line()}"}
    return True
