"""Tiles cut on the device from frames decoded there once, not decoded tile by tile.

The training sampler draws a sliced set frame by frame (frames shuffled, each
frame's tiles together), so a frame's tiles fill one batch or a few consecutive
ones. `TileCutter` keeps the frames the previous batch decoded (on the device)
and decodes only the new ones: each frame is decoded once per visit, however
many tiles it gives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from musubi.data.gpu_decode import DecodeStats, decode_images
from musubi.data.jpeg_decoder import JpegDecoder
from musubi.data.sliced import EncodedTiles


class TileCutter:
    """Decode a batch's frames (reusing the previous batch's) and cut its tiles, padded to tile x tile."""

    def __init__(self, tile: int, stats: DecodeStats | None = None) -> None:
        self.tile = tile
        self.stats = stats if stats is not None else DecodeStats()
        #: (data set, frame index) -> uint8 [3, H, W] on the device, the frames of the last batch.
        self.kept: dict[tuple[str, int], Tensor] = {}
        #: Frames decoded so far (the tests count them: once per visit, not once per tile).
        self.decoded = 0

    def cut(self, batch: EncodedTiles, device: torch.device, decoder: JpegDecoder | None = None) -> list[Tensor]:
        """uint8 [3, tile, tile] per tile of the batch, on `device` (frames decoded by the rank's `decoder`)."""
        keys = [(batch.source, f) for f in batch.frame_ids]
        new = [i for i, k in enumerate(keys) if k not in self.kept]
        decoded = decode_images([batch.frames[i] for i in new], device, self.stats, decoder) if new else []
        self.decoded += len(new)
        frames = {k: self.kept[k] for k in keys if k in self.kept}
        frames.update({keys[i]: img for i, img in zip(new, decoded, strict=True)})
        self.kept = frames  # only this batch's frames: the next batch shares at most these
        t = self.tile
        out = []
        for which, (x0, y0, x1, y1) in zip(batch.frame_of, batch.windows, strict=True):
            piece = frames[keys[which]][:, y0:y1, x0:x1]
            if piece.shape[1] < t or piece.shape[2] < t:  # the frame's last row/column: zeros right and below
                piece = F.pad(piece, (0, t - piece.shape[2], 0, t - piece.shape[1]))
            out.append(piece)
        return out
