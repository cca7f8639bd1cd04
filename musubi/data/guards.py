"""Guards for data sets made by someone else: image bombs, escaping symlinks, hostile JSON.

Every reader of files on disk (COCO, image folders, `musubi data` checks) uses
these, so a hostile or broken data set ends in one ConfigError line naming the
file and the fix, never in a worker killed by the OOM killer or a file read
from outside the data set:

- `open_image`: the pixel count is checked from the header, before anything is
  decoded, against a configurable maximum (`data.max_image_pixels`, default
  PIL's own decompression-bomb limit); truncated or undecodable files are refused.
- `inside`: a file reached through a symlink must stay under its data-set root.
- `load_json`: a size bound before parsing, and parser failures (nesting depth,
  4300-digit integers, bad UTF-8) turned into one line.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from PIL import Image

from musubi.contract.errors import ConfigError

#: PIL's own decompression-bomb limit (~89.5 MP: a 1024 MiB RGBA image); the default maximum.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485
#: Largest integer a COCO id may be (it becomes an int64 tensor).
MAX_INT64 = 2**63 - 1


def inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """`path` if, with every symlink followed, it lies under `root`; else ConfigError."""
    real_root = Path(root).resolve()
    real = Path(path).resolve()
    if real != real_root and real_root not in real.parents:
        raise ConfigError(
            f"{path}: resolves to {real}, outside the data set {real_root} (a symlink leaves it); "
            "copy the file into the data set or remove the link"
        )
    return real


def open_image(path: str | os.PathLike[str], max_pixels: int | None = None, keep_mode: bool = False) -> Image.Image:
    """An RGB image (`keep_mode`: in its stored mode, e.g. 16-bit I;16), refused (ConfigError) when over
    `max_pixels` by its header, or unreadable."""
    # No maximum given: PIL's own (process-wide) limit, or its default when it was switched off.
    limit = max_pixels or Image.MAX_IMAGE_PIXELS or DEFAULT_MAX_IMAGE_PIXELS
    fix = f"tile or downscale the image, or raise data.max_image_pixels (now {limit})"
    if max_pixels and Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < limit:
        # PIL's own guard would refuse what the user allowed; ours below is exact.
        Image.MAX_IMAGE_PIXELS = limit
    try:
        with warnings.catch_warnings():
            # PIL only warns between 1x and 2x its limit; the exact check below refuses instead.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                # Checked before decoding: the header is all that has been read so far.
                if im.width * im.height > limit:
                    raise ConfigError(f"{path}: image is {im.width}x{im.height} pixels, over the {limit} "
                                      f"pixel limit; {fix}")
                return im.copy() if keep_mode else im.convert("RGB")
    except ConfigError:
        raise
    except Image.DecompressionBombError:
        raise ConfigError(f"{path}: image is over the {limit} pixel limit (decompression-bomb guard); {fix}"
                          ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:  # PIL reports broken files in all these ways
        raise ConfigError(f"{path}: cannot read image ({' '.join(str(e).split())[:160]}); replace or remove "
                          "the file") from None


def load_json(path: Path, max_bytes: int, what: str = "JSON file") -> Any:
    """Parse a JSON file of at most `max_bytes`; every parser failure is one ConfigError line."""
    size = path.stat().st_size
    if size > max_bytes:
        raise ConfigError(f"{path}: {what} is {size / 2**20:.1f} MiB, over the {max_bytes / 2**20:.0f} MiB limit; "
                          "split it into smaller files")
    try:
        with path.open("rb") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); fix or "
                          "re-export it") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; re-export it as UTF-8 JSON") from None
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply to parse; re-export it") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise ConfigError(f"{path}: unreadable JSON value ({' '.join(str(e).split())[:120]}); fix or "
                          "re-export it") from None


def is_id(value: Any) -> bool:
    """A JSON integer usable as an int64 id (not a bool, not out of range)."""
    return isinstance(value, int) and not isinstance(value, bool) and -MAX_INT64 <= value <= MAX_INT64
