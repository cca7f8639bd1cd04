"""JPEG decoders side by side: the same batch through each decoder a rank can choose, pixels and time.

    python bench/jpeg_decode.py [--frames 16] [--width 1920] [--height 1080] [--reps 10] [--json OUT.json]
    python bench/jpeg_decode.py --cpu      # the host decoders only (plumbing)

The batch: `--frames` synthetic frames (musubi.data.synthetic_files.draw_frame: small objects on a big
frame), baseline 4:2:0 JPEG at quality 90, as bench/data.py's sets. Decoders (musubi.data.jpeg_decoder):
  host      PIL per image (the reference pixels; what loader workers do);
  cuda      torchvision's nvJPEG on the SMs, one batched call (musubi.data.gpu_decode.decode_images);
  hardware  nvImageCodec on the GPU's hardware JPEG engines, when installed and usable (else its reason).
Per decoder: ms per batch (host wall time of the call until the device is done, mean of --reps after 2
warm-ups), and the pixel difference from the host reference (mean, 99.9th percentile, max, in 8-bit levels:
JPEG decoders differ by an IDCT's rounding and chroma upsampling, a level or two), and
  mixed      one batch of baseline JPEGs, a progressive JPEG and a PNG through the decoder: the engines
             take the baseline ones, nvJPEG the progressive one (the engines refuse it), the host the PNG.
On a GPU also:
  steal_pct  how much longer a fixed bf16 matmul loop on the training stream takes while a thread decodes
             batches on a side stream (what the decode takes from a training step's SMs; 0 = nothing).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from musubi.data.gpu_decode import DecodeStats, decode_images, decode_on_host  # noqa: E402
from musubi.data.jpeg_decoder import CUDA, HOST, JpegDecoder, choose  # noqa: E402
from musubi.data.synthetic_files import SyntheticFiles, draw_frame  # noqa: E402


def encode(frame: np.ndarray, **kw: Any) -> torch.Tensor:
    """An RGB frame as JPEG (or kw's format) file bytes, uint8 [N]."""
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, **({"format": "JPEG", "quality": 90} | kw))
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def make_batch(frames: int, width: int, height: int) -> tuple[list[torch.Tensor], list[np.ndarray]]:
    """`frames` JPEG files' bytes (pinned, as the loader hands them over) and the frames drawn."""
    p = SyntheticFiles(frames, width, height, 4, 12, 12, 64, seed=1)
    drawn = [draw_frame(p, i)[0] for i in range(frames)]
    files = [encode(f) for f in drawn]
    if torch.cuda.is_available():
        files = [f.pin_memory() for f in files]
    return files, drawn


def compare(got: list[torch.Tensor], ref: list[torch.Tensor]) -> dict[str, float]:
    """Pixel difference of two decodes of the same files, in 8-bit levels (from a histogram: exact, small)."""
    hist = torch.zeros(256, dtype=torch.int64)
    for g, r in zip(got, ref, strict=True):
        assert tuple(g.shape) == tuple(r.shape), f"shapes differ: {tuple(g.shape)} vs {tuple(r.shape)}"
        d = (g.cpu().to(torch.int16) - r.to(torch.int16)).abs_().to(torch.uint8).flatten()
        hist += torch.bincount(d, minlength=256)
    n = int(hist.sum())
    levels = torch.arange(256, dtype=torch.float64)
    cum = hist.cumsum(0)
    return {"mean_abs_diff": round(float((hist * levels).sum()) / n, 4),
            "p999_abs_diff": int((cum < 0.999 * n).sum()), "max_abs_diff": int(hist.nonzero().max())}


def timed_ms(fn: Any, reps: int, device: torch.device) -> float:
    """Mean wall ms of fn() until the device is done, after 2 warm-ups."""
    for _ in range(2):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return round(1000 * (time.perf_counter() - t0) / reps, 2)


def steal_pct(decode: Any, device: torch.device, gemms: int = 300) -> dict[str, float]:
    """Slowdown of a bf16 matmul loop on the default stream while a thread decodes on a side stream."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

    def loop() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(gemms):
            a @ a
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    loop()
    alone = loop()
    stop = threading.Event()
    batches = [0]

    def decoder_thread() -> None:
        torch.cuda.set_device(device)
        side = torch.cuda.Stream(device)
        with torch.cuda.stream(side):
            while not stop.is_set():
                decode()
                side.synchronize()
                batches[0] += 1

    t = threading.Thread(target=decoder_thread, daemon=True)
    t.start()
    time.sleep(0.2)  # the decoder is running before the loop starts
    shared = loop()
    stop.set()
    t.join()
    return {"gemm_ms_alone": round(alone, 1), "gemm_ms_while_decoding": round(shared, 1),
            "steal_pct": round(100 * (shared - alone) / alone, 2), "batches_decoded_meanwhile": batches[0]}


def mixed_batch(decoder: JpegDecoder, drawn: list[np.ndarray], device: torch.device) -> dict[str, Any]:
    """Baseline JPEGs, one progressive JPEG and one PNG in one batch: where each was decoded."""
    files = [encode(f) for f in drawn[:4]] + [encode(drawn[4], progressive=True), encode(drawn[5], format="PNG")]
    stats = DecodeStats(decoder=decoder.name)
    out = decode_images(files, device, stats, decoder)
    ref = [decode_on_host(f) for f in files]
    return {**stats.record(), **compare(out, ref)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=16, help="Frames in the batch (default 16: bs16 a GPU).")
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--reps", type=int, default=10, help="Timed batches per decoder (after 2 warm-ups).")
    ap.add_argument("--cpu", action="store_true", help="Host decoders only (no GPU needed).")
    ap.add_argument("--json", type=Path, default=Path("bench-jpeg-decode.json"))
    args = ap.parse_args()
    device = torch.device("cpu") if args.cpu or not torch.cuda.is_available() else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    files, drawn = make_batch(args.frames, args.width, args.height)
    ref = [decode_on_host(f) for f in files]
    rows: dict[str, Any] = {"host": {"decoder": "PIL (host, per image)",
                                     "ms_per_batch": timed_ms(lambda: [decode_on_host(f) for f in files], 2,
                                                              torch.device("cpu")), **compare(ref, ref)}}
    decoders = {"cuda": JpegDecoder(CUDA if device.type == "cuda" else HOST)}
    chosen = choose(device, "hardware") if device.type == "cuda" else None
    if chosen is not None and chosen.hardware is not None:
        decoders["hardware"] = chosen
    for name, dec in decoders.items():
        stats = DecodeStats(decoder=dec.name)
        out = decode_images(files, device, stats, dec)
        row: dict[str, Any] = {"decoder": dec.describe(), **compare(out, ref), "counts": stats.record()}
        row["ms_per_batch"] = timed_ms(lambda dec=dec: decode_images(files, device, DecodeStats(), dec), args.reps,
                                       device)
        if device.type == "cuda":
            row.update(steal_pct(lambda dec=dec: decode_images(files, device, DecodeStats(), dec), device))
        row["mixed"] = mixed_batch(dec, drawn, device)
        rows[name] = row
        del out
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "batch": f"{args.frames} x {args.width}x{args.height} JPEG q90 4:2:0",
              "nvimgcodec": nvimgcodec_version(),
              "hardware_why_not": (chosen.why_not if chosen is not None else "a CPU run"),
              "decoders": rows, "command": " ".join(sys.argv)}
    args.json.write_text(json.dumps(result, indent=1))
    print(f"{result['device']}, {result['batch']}, nvImageCodec {result['nvimgcodec'] or 'not installed'}")
    for name, r in rows.items():
        extra = f", steals {r['steal_pct']:.1f} % of a matmul loop" if "steal_pct" in r else ""
        print(f"  {name:<9} {r['ms_per_batch']:8.2f} ms/batch  diff vs host: mean {r['mean_abs_diff']:.3f}, "
              f"p99.9 {r['p999_abs_diff']:.0f}, max {r['max_abs_diff']}{extra}  [{r['decoder']}]")
        if "mixed" in r:
            m = r["mixed"]
            print(f"            mixed batch: {m['hardware']} on the engines, {m['device']} on the device, "
                  f"{m['host']} on the host ({m['host_reasons']}); max diff {m['max_abs_diff']}")
    if "hardware" not in rows:
        print(f"  hardware  not measured: {result['hardware_why_not']}")
    print(f"wrote {args.json}")


def nvimgcodec_version() -> str | None:
    """nvImageCodec's version where it imports, else None."""
    try:
        from musubi.data.jpeg_decoder import import_nvimgcodec

        return str(import_nvimgcodec()[0].__version__)
    except ImportError:
        return None


if __name__ == "__main__":
    main()
