"""Which decoder reads a batch's JPEG files on a rank, chosen once at start: the GPU's hardware JPEG engines,
nvJPEG's CUDA kernels on its SMs, or the host.

A100, H100 and H200 carry hardware JPEG decoders (NVJPG engines) beside the SMs. torchvision's
`decode_jpeg(device="cuda")` does not use them: its nvJPEG decode runs CUDA kernels on the SMs, beside
the training step (on 4 H100s a batch of 16 1920x1080 frames took 73.7 ms of SM time beside a 218 ms step,
issue 46). nvImageCodec (`pip install 'musubi-train[hwdecode]'`: nvidia-nvimgcodec-cu13 with libnvjpeg,
about 30 MB) reaches the engines; torchcodec's image decode and DALI do too (DALI at ~10x the install).
`data.jpeg_decoder` chooses:

  auto      the engines where nvImageCodec is installed and the GPU has them, else nvJPEG on the SMs;
  hardware  the same, with a one-line warning saying what is missing when the engines cannot be used;
  cuda      torchvision's nvJPEG on the SMs (the path before issue 46), engines or not.

A CPU rank decodes on the host (libjpeg-turbo) whatever is asked. Within a batch, an image the engines
refuse (e.g. a progressive JPEG) goes to nvJPEG on the SMs, and what nvJPEG refuses to the host
(musubi.data.gpu_decode.decode_images), so the order of preference holds image by image.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger(__name__)

#: What the feeder's log line and summary.json (loader.decoded.decoder) call each decoder.
HARDWARE = "nvImageCodec on the GPU's hardware JPEG engines"
CUDA = "nvJPEG on the GPU's SMs (torchvision)"
HOST = "libjpeg-turbo on the host (torchvision)"
#: How to get the engines where nvImageCodec is missing (the extra pins the CUDA 13 wheels).
INSTALL_HINT = "pip install 'musubi-train[hwdecode]' (CUDA 12 stacks: pip install 'nvidia-nvimgcodec-cu12[nvjpeg]')"
#: Host threads nvImageCodec parses JPEG headers with: the engines do the Huffman decoding, so two threads keep
#: up with a batch of 16 frames and leave the rank's other cores to its loader workers.
PARSE_THREADS = 2
#: Side of the probe image decoded at start: proves the engines decode, not just that the library loads.
PROBE_SIDE = 64


@dataclass
class JpegDecoder:
    """The decoder a rank chose at start (`name`), the engines' decoder if they were chosen, and why not if not."""

    name: str
    hardware: HardwareJpeg | None = None
    #: Why the engines are not used ("" when they are, or when the choice never asked for them).
    why_not: str = ""

    def describe(self) -> str:
        """The feeder's phrase: the decoder, and the fallback order within a batch."""
        if self.hardware is not None:
            return f"{HARDWARE}; what they refuse: {CUDA}"
        return self.name


class HardwareJpeg:
    """nvImageCodec's decoder restricted to the hardware engines (backend HW_GPU_ONLY) on one device.

    The batch is decoded on the caller's current CUDA stream (the prefetcher's side stream), into memory
    nvImageCodec allocates stream-ordered (cudaMallocAsync: freeing it never waits for the device); the
    frames reach torch through DLPack without a copy, as [3, H, W] views of nvImageCodec's H x W x 3 buffers.
    """

    def __init__(self, codec: ModuleType, decoder: Any, device: torch.device) -> None:
        self.codec, self.decoder, self.device = codec, decoder, device
        # No EXIF rotation: boxes are in stored pixels, as PIL (workers) and torchvision read them.
        self.params = codec.DecodeParams(apply_exif_orientation=False, color_spec=codec.ColorSpec.SRGB,
                                         allow_any_depth=False, sample_format=codec.SampleFormat.I_RGB)
        # Validation batches decode on the training thread while the prefetch thread decodes the next training
        # batch; one decoder object is not documented as safe for two threads at once.
        self.lock = threading.Lock()

    def decode(self, encoded: list[Tensor]) -> list[Tensor | None]:
        """File bytes (uint8 [N] on the host) -> uint8 [3, H, W] on the device, None where the engines refused."""
        streams = [self.codec.CodeStream(e.numpy()) for e in encoded]  # views of the (pinned) batch bytes
        handle = torch.cuda.current_stream(self.device).cuda_stream
        with self.lock:
            images = self.decoder.decode(streams, params=self.params, cuda_stream=handle)
        # from_dlpack hands this stream to nvImageCodec, which orders it after the decode (same stream: no wait).
        return [None if im is None else torch.from_dlpack(im).permute(2, 0, 1) for im in images]


def choose(device: torch.device, wanted: str) -> JpegDecoder:
    """The rank's JPEG decoder for `data.jpeg_decoder` (auto | hardware | cuda) on `device`, opened once at start."""
    device = torch.device(device)
    if device.type != "cuda":
        if wanted == "hardware":
            log.warning("data.jpeg_decoder: hardware, but this rank runs on %s: decoding JPEG with %s", device, HOST)
        return JpegDecoder(HOST, why_not="a CPU rank" if wanted != "cuda" else "")
    if wanted == "cuda":
        return JpegDecoder(CUDA)
    hardware, why_not = open_hardware(device)
    if hardware is not None:
        return JpegDecoder(HARDWARE, hardware)
    if wanted == "hardware":
        log.warning("data.jpeg_decoder: hardware, but %s: decoding JPEG with %s", why_not, CUDA)
    else:
        log.info("JPEG decode: %s (%s)", CUDA, why_not)
    return JpegDecoder(CUDA, why_not=why_not)


def open_hardware(device: torch.device) -> tuple[HardwareJpeg | None, str]:
    """nvImageCodec's hardware decoder on `device` after it decoded a probe image, else (None, why not)."""
    try:
        codec, chatter = import_nvimgcodec()
    except ImportError:
        return None, f"nvImageCodec is not installed ({INSTALL_HINT})"
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        decoder = codec.Decoder(device_id=index, max_num_cpu_threads=PARSE_THREADS,
                                backends=[codec.Backend(codec.BackendKind.HW_GPU_ONLY)])
        hardware = HardwareJpeg(codec, decoder, device)
        ok = probe(hardware)
    except Exception as e:  # noqa: BLE001 - any failure of an optional accelerator means: use the SMs
        return None, f"nvImageCodec could not decode on {device} ({one_line(e)})"
    if not ok:
        if "nvjpeg library" in chatter.lower():
            return None, "nvImageCodec found no libnvjpeg (pip install nvidia-nvjpeg, or 'musubi-train[hwdecode]')"
        return None, f"the GPU of {device} has no hardware JPEG engine nvImageCodec can use"
    return hardware, ""


def probe(hardware: HardwareJpeg) -> bool:
    """Decode a small baseline 4:2:0 JPEG on the engines (default stream, waited for) and check its pixels."""
    from PIL import Image

    ramp = np.linspace(0, 255, PROBE_SIDE, dtype=np.uint8)
    rgb = np.stack(np.broadcast_arrays(ramp[None, :], ramp[:, None], ramp[None, ::-1]), axis=2)
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(buf, format="JPEG", quality=95)
    code = hardware.codec.CodeStream(np.frombuffer(buf.getvalue(), dtype=np.uint8))
    with hardware.lock:
        out = hardware.decoder.decode([code], params=hardware.params, cuda_stream=0)
    if not out or out[0] is None:
        return False
    got = np.asarray(out[0].cpu())  # a host copy: waits for the decode
    return got.shape == rgb.shape and float(np.abs(got.astype(np.int16) - rgb).mean()) < 4.0


def import_nvimgcodec() -> tuple[ModuleType, str]:
    """nvImageCodec's module and what its import printed (kept out of the rank's log; searched for causes).

    Its import loads every codec extension and prints, unconditionally (fprintf), a paragraph for each
    library it lacks (nvJPEG2000, nvTIFF: not needed for JPEG); its own logger stays quiet unless
    PYNVIMGCODEC_VERBOSITY is set by the user.
    """
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
    with captured_output() as text:
        from nvidia import nvimgcodec
    return nvimgcodec, text.getvalue()


@contextlib.contextmanager
def captured_output() -> Iterator[io.StringIO]:
    """File descriptors 1 and 2 sent to a temporary file for the block (C libraries write there, not through
    sys.stdout); the text is in the yielded buffer after the block."""
    out = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield out
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            out.write(tmp.read().decode(errors="replace"))


def one_line(e: BaseException) -> str:
    """An exception's first line (its type when it has no text), at most 160 characters."""
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:160]
