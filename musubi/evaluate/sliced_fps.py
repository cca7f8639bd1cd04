"""FPS labelled by what one timed call covers, and the ONNX FPS of a sliced job measured as it is deployed.

A job trained on slices is scored on whole frames (tiles predicted, shifted and
merged); its torch FPS times the same whole-frame path. Its exported graph takes
one tile, so feeding it a whole frame (resized inside the graph to the tile side)
would time something no deployment runs: its ONNX Runtime FPS is timed on a whole
validation frame through the recipe's tiling and merge, one graph call a tile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from musubi.data.slicing import tile_grid
from musubi.evaluate.fps import (
    CPU_FPS_THREADS,
    PROTOCOL,
    device_name,
    resolve_device,
    run_counts,
    summarise,
    threads_said,
    time_runs,
)
from musubi.evaluate.model_io import JobModel, sample_batch
from musubi.evaluate.recipe import slice_rule


def fps_unit(job: JobModel, frame_shape: list[int] | None = None) -> str:
    """What one timed call of the job's FPS covers: a whole image, or a whole frame cut into tiles and merged."""
    rule = slice_rule(job.spec)
    if rule is None:
        return "whole image"
    tiles = ""
    if frame_shape and len(frame_shape) >= 2:
        h, w = int(frame_shape[-2]), int(frame_shape[-1])
        tiles = f" ({len(tile_grid(w, h, rule['tile'], rule['overlap']))} tiles of {w}x{h})"
    return f"whole frame{tiles}: {rule['tile']} px tiles, overlap {rule['overlap']:g}, merged by {rule['merge']}"


def tiled_onnx_fps(job: JobModel, path: Path, device: str | None, warmup: int | None,
                   runs: int | None) -> dict[str, Any]:
    """ONNX Runtime FPS of a sliced job's one-tile graph on a whole validation frame, tiling and merge included."""
    import torch

    from musubi.evaluate.predictors import OnnxPredictor

    dev = resolve_device(device)
    warmup, runs = run_counts(dev, warmup, runs)
    # CPU_FPS_THREADS as onnx_fps: every job's CPU FPS at one stated thread count, tiled or not.
    predictor = OnnxPredictor(Path(path), dev, threads=CPU_FPS_THREADS)
    # A whole validation frame as the model takes it (the task's to_device: decoded, scaled or standardised).
    frame = job.task.to_device(sample_batch(job.task, 1), torch.device("cpu"))[0][0]
    times = time_runs(lambda: predictor.detect_input(frame), warmup, runs)
    runtime = predictor.described.rsplit("(", 1)[-1].rstrip(")")
    protocol = PROTOCOL.format(warmup=warmup, runs=runs).replace(
        "forward only (input already on the device for torch)",
        "session.run once a tile with host inputs and outputs, tiles shifted and merged on the host")
    threads = None if runtime.endswith("cuda") else CPU_FPS_THREADS
    protocol += threads_said(threads)
    used = dev if runtime.endswith("cuda") else resolve_device("cpu")
    return {**summarise(times, warmup), "input_shape": [1, *frame.shape], "device": str(used),
            "device_name": device_name(used), "runtime": runtime, "precision": "float32", "threads": threads,
            "protocol": protocol, "unit": fps_unit(job, list(frame.shape))}
