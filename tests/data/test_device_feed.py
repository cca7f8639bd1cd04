"""The device feed on CPU tensors: decode with host fallback, tiles from frames decoded once, prefetch, resume."""

from __future__ import annotations

import gc
import io
import logging
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from musubi.config.job import JobSpec
from musubi.contract.world import World
from musubi.data.gpu_decode import DecodeStats, PackedBytes, decode_images, host_only_reason
from musubi.data.sliced import SlicedCocoDetection
from musubi.data.stage_clock import StageClock
from musubi.tasks.detection import DetectionTask
from musubi.worker.feed.loaders import TrainFeed
from musubi.worker.feed.prefetch import DevicePrefetcher

from .sets import small_set

CPU = torch.device("cpu")
WORLD = World(rank=0, local_rank=0, size=1, device=CPU, backend="gloo")


def _encode(img: Image.Image, fmt: str, **kw: Any) -> torch.Tensor:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _task(root: Path, ann: Path, **data: Any) -> DetectionTask:
    split = {"path": str(root / "images"), "annotations": str(ann)}
    spec = JobSpec(name="det", task="detection", model="fasterrcnn_mobilenet_v3_large_320_fpn",
                   data={"train": split, "workers": 0, **data}, train={"batch": 2, "seed": 3})
    task = DetectionTask(spec)
    task.use_device(CPU)
    return task


def test_what_nvjpeg_cannot_read_is_decoded_on_the_host_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    rgb = Image.fromarray(np.arange(24 * 16 * 3, dtype=np.uint8).reshape(16, 24, 3))
    jpeg, png = _encode(rgb, "JPEG", quality=95), _encode(rgb, "PNG")
    cmyk = _encode(rgb.convert("CMYK"), "JPEG", quality=95)
    deep = _encode(Image.fromarray(np.arange(16 * 24, dtype=np.uint16).reshape(16, 24) * 170), "PNG")
    assert [host_only_reason(x) for x in (jpeg, png, cmyk, deep)] == [None, "PNG", "CMYK JPEG", "PNG"]
    stats = DecodeStats()
    with caplog.at_level(logging.WARNING):
        out = decode_images([jpeg, png, cmyk, deep], CPU, stats)
    assert [tuple(o.shape) for o in out] == [(3, 16, 24)] * 4 and all(o.dtype == torch.uint8 for o in out)
    assert torch.equal(out[1], torch.from_numpy(np.asarray(rgb)).permute(2, 0, 1))  # PNG: lossless
    assert (out[0].float() - out[1].float()).abs().mean() < 4 and (out[2].float() - out[1].float()).abs().mean() < 8
    assert int(out[3].max()) == (16 * 24 - 1) * 170 >> 8  # 16-bit scaled to 8, not clipped at 255
    assert stats.record() == {"decoder": "", "device": 1, "hardware": 0, "host": 3,
                              "host_reasons": {"PNG": 2, "CMYK JPEG": 1}}
    assert "1 image(s) decoded on the host" in caplog.text  # warned once (at 1, 10, 100 ...), not per image


def test_a_mixed_set_trains_through_the_device_path(tmp_path: Path) -> None:
    ann = small_set(tmp_path, images=4, width=64, height=48)
    Image.open(tmp_path / "images" / "frame_00001.jpg").save(tmp_path / "images" / "frame_00001.png")
    import json

    data = json.loads(ann.read_text())
    data["images"][1]["file_name"] = "frame_00001.png"
    ann.write_text(json.dumps(data))
    task = _task(tmp_path, ann, gpu_decode=True, image_size=32)
    ds = task.train_dataset()
    assert task.device_decode and ds[0][0].dim() == 1  # workers hand over file bytes
    batch = task.collate([ds[i] for i in range(4)])
    assert isinstance(batch[0], PackedBytes) and batch[0].data.dim() == 1  # ... packed into one tensor a batch
    assert all(torch.equal(a, ds[i][0]) for i, a in enumerate(batch[0].unpack()))
    images, targets = task.to_device(batch, CPU)
    assert [tuple(i.shape) for i in images] == [(3, 24, 32)] * 4
    assert task.feed_counts()["decoded"]["host_reasons"] == {"PNG": 1}
    # auto: a CPU rank keeps decoding in the workers; a CUDA rank with mostly JPEG files decodes on it.
    assert not _task(tmp_path, ann).device_decode
    auto = _task(tmp_path, ann)
    auto.device = torch.device("cuda", 0)  # the decision only (no GPU here): 3 of 4 files are JPEG
    auto.train_dataset()
    assert auto.device_decode and "batched on cuda:0 (nvJPEG" in auto.feed_path()["decode"]


def test_tiles_are_cut_from_frames_decoded_once_per_visit(tmp_path: Path) -> None:
    ann = small_set(tmp_path, images=3, width=100, height=70, objects=5)
    host = _task(tmp_path, ann, gpu_decode=False, slice={"tile": 32, "overlap": 0.2, "empty_ratio": 1.0},
                 cache="off")
    dev = _task(tmp_path, ann, gpu_decode=True, slice={"tile": 32, "overlap": 0.2, "empty_ratio": 1.0})
    hds, dds = host.train_dataset(), dev.train_dataset()
    assert isinstance(dds, SlicedCocoDetection) and dds.encoded and dds.frame_groups and len(hds) == len(dds)
    order = [i for group in dds.frame_groups for i in group]  # the sampler's frame-by-frame order
    tiles_per_frame = [len(g) for g in dds.frame_groups]
    got = []
    for k in range(0, len(order), 4):
        idx = order[k:k + 4]
        images, targets = dev.to_device(dev.collate([dds[i] for i in idx]), CPU)
        ref_images, ref_targets = host.to_device(host.collate([hds[i] for i in idx]), CPU)
        for a, b, ta, tb in zip(images, ref_images, targets, ref_targets, strict=True):
            assert a.shape == b.shape == (3, 32, 32) and torch.allclose(a, b)  # same decoder, same pixels
            assert torch.equal(ta["boxes"], tb["boxes"]) and torch.equal(ta["labels"], tb["labels"])
        got += idx
    assert got == order and dev.cutter is not None
    assert dev.cutter.decoded == 3 < sum(tiles_per_frame)  # each frame once, not once per tile


def test_the_threaded_prefetcher_keeps_order_and_carries_errors() -> None:
    pre = DevicePrefetcher(lambda b: b * 10, CPU, threaded=True)
    assert list(pre.batches(iter(range(7)))) == [0, 10, 20, 30, 40, 50, 60]

    def broken(b: int) -> int:
        if b == 3:
            raise ValueError("bad batch 3")
        return b

    it = DevicePrefetcher(broken, CPU, threaded=True).batches(iter(range(7)))
    assert [next(it), next(it), next(it)] == [0, 1, 2]
    with pytest.raises(ValueError, match="bad batch 3"):
        next(it)
    early = DevicePrefetcher(lambda b: b, CPU, threaded=True).batches(iter(range(1000)))
    assert next(early) == 0
    early.close()  # a run that stops mid-epoch: the thread ends, nothing hangs


def _stream(feed: TrainFeed, epoch: int, start: int) -> list[tuple[torch.Tensor, ...]]:
    return [(*images, *(t["boxes"] for t in targets)) for images, targets in feed.epoch(epoch, start)]


@pytest.mark.parametrize("threaded", [False, True])
def test_the_augmented_stream_resumes_exactly(tmp_path: Path, threaded: bool) -> None:
    ann = small_set(tmp_path, images=8, width=64, height=48, objects=3)
    aug = {"hflip": 0.5, "scale": [0.6, 1.4], "mosaic": 0.5, "brightness": 0.2, "contrast": 0.2, "saturation": 0.2}

    def feed() -> TrainFeed:
        f = TrainFeed(_task(tmp_path, ann, gpu_decode=True, augment=aug), WORLD, batch=2, seed=3, workers=0,
                      pin=False)
        f.prefetcher.threaded = threaded
        return f

    first = feed()
    whole = [_stream(first, e, 0) for e in (0, 1)]
    # Every stage of every batch is timed (summary.json's loader.times), in the order a batch meets them.
    times = first.times()
    assert list(times) == ["read", "decode", "convert", "augment", "h2d", "prepare", "wait"]
    assert {row["batches"] for row in times.values()} == {8} and all(r["host_ms"] >= 0 for r in times.values())
    assert first.plan.record()["augment"].startswith("mosaic, scale, hflip, colour on cpu")
    assert "batched on cpu" in first.plan.record()["decode"]
    # A new process resumes at micro-batch 2 of epoch 1: the same batches, bit for bit.
    tail = _stream(feed(), 1, 2)
    assert len(tail) == len(whole[1]) - 2
    for a, b in zip(tail, whole[1][2:], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    # Epochs differ (the epoch is in every sample's seed), and augmenting changed something.
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(whole[0], whole[1], strict=True))
    plain = TrainFeed(_task(tmp_path, ann, gpu_decode=True), WORLD, batch=2, seed=3, workers=0, pin=False)
    assert any(a[0].shape != b[0].shape or not torch.equal(a[0], b[0])
               for a, b in zip(_stream(plain, 0, 0), whole[0], strict=True))
    # Freed by its reference count, not by the cycle collector (which made a DataLoader wait ~5 s a worker).
    gc.disable()
    try:
        gone = weakref.ref(first)
        del first
        assert gone() is None
    finally:
        gc.enable()


def _epochs_feed(root: Path, ann: Path, threaded: bool) -> TrainFeed:
    """A device-decoding, augmenting feed of 4 micro-batches an epoch over 3 epochs."""
    split = {"path": str(root / "images"), "annotations": str(ann)}
    spec = JobSpec(name="det", task="detection", model="fasterrcnn_mobilenet_v3_large_320_fpn",
                   data={"train": split, "workers": 0, "gpu_decode": True, "augment": {"hflip": 0.5, "mosaic": 0.5}},
                   train={"batch": 2, "seed": 3, "epochs": 3})
    task = DetectionTask(spec)
    task.use_device(CPU)
    feed = TrainFeed(task, WORLD, batch=2, seed=3, workers=0, pin=False)
    feed.prefetcher.threaded = threaded
    return feed


def _same(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) and all(torch.equal(p, q) for p, q in zip(x, y, strict=True))
                                    for x, y in zip(a, b, strict=True))


def test_the_next_epoch_is_prepared_while_the_last_steps_run(tmp_path: Path) -> None:
    """No gap at an epoch boundary: before the trainer asks for epoch 1, its first batches are already prepared
    (read and decoded by the prefetch thread); the batches are the ones a fresh feed gives for that epoch."""
    import time

    ann = small_set(tmp_path, images=8, width=64, height=48, objects=3)
    feed = _epochs_feed(tmp_path, ann, threaded=True)
    assert feed.micro_per_epoch == 4
    epoch0 = _stream(feed, 0, 0)
    # The last step of epoch 0 runs: the prefetch thread goes on into epoch 1 meanwhile (polled, not timed: a
    # loaded machine may be slow, but the batches must come without being asked for).
    deadline = time.monotonic() + 30
    while feed.prefetcher.clock.record().get("prepare", {}).get("batches", 0) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    prepared = feed.prefetcher.clock.record()["prepare"]["batches"]
    assert 5 <= prepared <= 4 + feed.prefetcher.depth + 1, prepared  # ahead, but no further than the queue holds
    assert feed.prefetcher.clock.record()["wait"]["batches"] == 4  # ... and none of them was asked for yet
    epoch1 = _stream(feed, 1, 0)
    # Exact order unchanged: the same batches as a new feed (a resumed run) reads for each epoch.
    fresh = _epochs_feed(tmp_path, ann, threaded=False)
    assert _same(epoch0, _stream(fresh, 0, 0)) and _same(epoch1, _stream(fresh, 1, 0))
    assert _same(_stream(feed, 2, 1), _stream(_epochs_feed(tmp_path, ann, threaded=False), 2, 1))
    feed.close()
    fresh.close()


@pytest.mark.parametrize("threaded", [False, True])
def test_the_stream_skips_leftovers_and_restarts_where_asked(tmp_path: Path, threaded: bool) -> None:
    """An epoch left early (micro-batches that fill no optimizer step) still gives the next epoch from its start;
    a position behind the stream (or far ahead of it) starts a new stream there, with the same batches."""
    ann = small_set(tmp_path, images=8, width=64, height=48, objects=3)
    ref = _epochs_feed(tmp_path, ann, threaded=False)
    want = {e: _stream(ref, e, 0) for e in range(3)}
    feed = _epochs_feed(tmp_path, ann, threaded=threaded)
    it = feed.epoch(0, 0)
    first = [next(it) for _ in range(3)]  # the 4th is a leftover: the trainer stops asking
    it.close()
    assert _same([(*i, *(t["boxes"] for t in tg)) for i, tg in first], want[0][:3])
    stream = feed._stream
    assert _same(_stream(feed, 1, 0), want[1]) and feed._stream is stream  # the running stream, not a new one
    assert _same(_stream(feed, 0, 2), want[0][2:]) and feed._stream is not stream  # behind: a new stream
    assert _same(_stream(feed, 2, 3), want[2][3:])  # far ahead: a new stream too
    feed.close()
    assert feed._stream is None and feed.worker_pids() == []
    ref.close()


def test_the_stage_clock_gives_means_a_batch_and_forgets_on_reset() -> None:
    clock = StageClock()
    clock.add("decode", 0.010)
    clock.add("decode", 0.030)
    with clock.stage("convert", CPU):  # no CUDA stream: host time only
        pass
    got = clock.record()
    assert got["decode"] == {"batches": 2, "host_ms": 20.0} and got["convert"]["batches"] == 1
    assert "device_ms" not in got["convert"]
    clock.reset()
    assert clock.record() == {}


def test_augment_is_refused_outside_classification_and_detection() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="data.augment is for the built-in classification and detection"):
        JobSpec(name="c", task="lm", model="gpt", data={"synthetic": {}, "augment": {"hflip": 0.5}})
    assert JobSpec(name="c", task="classification", model="resnet18",
                   data={"synthetic": {}, "augment": {"hflip": 0.5}}).data.augment is not None
