"""Single-channel frames (thermal infrared, greyscale) read without loss.

What Pillow (the only image reader here; tifffile is not a dependency) reads losslessly:
8-bit greyscale PNG/TIFF (mode L), 16-bit PNG and TIFF, little- or big-endian, uncompressed or
LZW/deflate (I;16, I;16B; older Pillow opens 16-bit PNG as 32-bit I, also exact), 32-bit
integer TIFF (I) and 32-bit float TIFF (F, e.g. temperatures in kelvin). Pixels become float32,
which holds every 8- and 16-bit value exactly. Multi-channel images are refused, not silently turned grey: a palette or RGB export of a
thermal camera has already lost its radiometry.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from musubi.contract.errors import ConfigError
from musubi.data import guards

#: PIL mode -> numpy dtype of a single-channel frame read as stored.
SINGLE_CHANNEL_MODES: dict[str, Any] = {
    "L": np.uint8, "I;16": np.uint16, "I;16L": np.uint16, "I;16B": np.uint16, "I;16N": np.uint16,
    "I": np.int32, "F": np.float32,
}


def read_single_channel(path: str | os.PathLike[str], max_pixels: int | None = None) -> np.ndarray:
    """[H, W] pixels as stored (uint8, uint16, int32 or float32); ConfigError for a multi-channel image."""
    im = guards.open_image(path, max_pixels, keep_mode=True)
    dtype = SINGLE_CHANNEL_MODES.get(im.mode)
    if dtype is None:
        raise ConfigError(f"{path}: image mode {im.mode} ({len(im.getbands())} channels), not single-channel; "
                          "set data.channels: 3 for RGB data, or export the frames as 8/16-bit greyscale PNG/TIFF")
    # astype: big-endian I;16B arrives as '>u2'; native order keeps every value.
    return np.asarray(im).astype(dtype, copy=False)
