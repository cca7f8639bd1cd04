"""Feeding detection: loader plan from the machine, uint8 and GPU-decode paths, sliced tasks end to end (CPU)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from musubi.config.job import JobSpec
from musubi.data.coco import CocoDetection
from musubi.data.gpu_decode import decode_batch
from musubi.data.sliced import SlicedCocoDetection
from musubi.tasks.detection import DetectionTask
from musubi.worker.feed import loader_plan
from musubi.worker.feed.loader_plan import plan_loader

from .sets import small_set


def _job(root: Path, ann: Path, **data: Any) -> JobSpec:
    split = {"path": str(root / "images"), "annotations": str(ann)}
    return JobSpec(name="det", task="detection", model="fasterrcnn_mobilenet_v3_large_320_fpn",
                   data={"train": split, "val": split, "workers": 0, **data})


def test_auto_workers_from_the_cores_of_each_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader_plan.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(loader_plan.os, "sched_getaffinity", lambda _: set(range(64)), raising=False)
    assert plan_loader("auto", True, 4, True, True, local_ranks=8).workers == 7  # 8 cores a rank, one trains
    assert plan_loader("auto", True, 4, True, True, local_ranks=1).workers == loader_plan.MAX_AUTO_WORKERS
    # A binder narrowed this rank to 4 cores: that set is its share already.
    monkeypatch.setattr(loader_plan.os, "sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False)
    plan = plan_loader("auto", True, 2, True, is_cuda=False, local_ranks=8)
    assert plan.workers == 3 and plan.pin_memory is False
    assert plan.kwargs() == {"num_workers": 3, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 2}
    assert plan_loader(0, True, 4, True, True).kwargs()["prefetch_factor"] is None
    # summary.json records what the loader got and where the worker count came from.
    assert plan.record() == {"workers": 3, "workers_from": "auto (4 cores for this rank)", "pin_memory": False,
                             "prefetch": 2, "persistent_workers": True}
    assert plan_loader(0, True, 4, True, True).record()["workers_from"] == "config"


def test_jpeg_bytes_decode_like_the_host_path(tmp_path: Path) -> None:
    ann = small_set(tmp_path, images=2, width=96, height=64)
    host = CocoDetection(tmp_path / "images", ann, image_size=48)
    raw = CocoDetection(tmp_path / "images", ann, image_size=48, encoded=True)
    images, targets = decode_batch([raw[i][0] for i in range(2)], [raw[i][1] for i in range(2)],
                                   torch.device("cpu"), 48)
    for i in range(2):
        ref_image, ref_target = host[i]
        assert images[i].shape == ref_image.shape == (3, 32, 48)
        assert torch.allclose(targets[i]["boxes"], ref_target["boxes"], atol=1e-4)
        assert (images[i] - ref_image).abs().mean() < 0.03  # two resamplers, same picture


@pytest.mark.timeout(120)
def test_jpeg_bytes_cross_loader_workers(tmp_path: Path) -> None:
    # The GPU-decode path through real worker processes (it died with EBADF on the GPU machine).
    from torch.utils.data import DataLoader

    ann = small_set(tmp_path, images=4, width=64, height=48)
    raw = CocoDetection(tmp_path / "images", ann, encoded=True)
    # Without the copy the loader waits forever for a batch its worker could not send: time it out.
    loader = DataLoader(raw, batch_size=2, num_workers=2, collate_fn=lambda b: tuple(zip(*b, strict=True)),
                        timeout=30)
    got = [img for images, _ in loader for img in images]
    assert len(got) == 4 and all(img.dtype == torch.uint8 and img[:2].tolist() == [0xFF, 0xD8] for img in got)


def test_config_refuses_contradictions(tmp_path: Path) -> None:
    ann = small_set(tmp_path, images=1)
    with pytest.raises(ValidationError, match="unset image_size"):
        _job(tmp_path, ann, slice={"tile": 32}, image_size=64)
    with pytest.raises(ValidationError, match="augment needs a data loader"):
        JobSpec(name="det", task="detection", model="fasterrcnn_mobilenet_v3_large_320_fpn",
                data={"synthetic": {"on_device": True}, "augment": {"hflip": 0.5}})
    with pytest.raises(ValidationError, match="0..64 or auto"):
        _job(tmp_path, ann, workers=65)


def test_sliced_task_trains_on_tiles_and_scores_whole_frames(tmp_path: Path) -> None:
    ann = small_set(tmp_path, images=2, width=120, height=80, objects=3)
    task = DetectionTask(_job(tmp_path, ann, slice={"tile": 48, "overlap": 0.25, "empty_ratio": 1.0}, cache="on"))
    train, val = task.train_dataset(), task.val_dataset()
    assert isinstance(train, SlicedCocoDetection) and train.cache is not None and task.image_size == 48
    assert isinstance(val, CocoDetection) and task.num_classes == 2
    images, targets = task.to_device(task.collate([train[0], train[1]]), torch.device("cpu"))
    assert images[0].dtype == torch.float32 and images[0].shape == (3, 48, 48) and float(images[0].max()) <= 1.0
    calls: list[int] = []

    def model(tiles: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        calls.append(len(tiles))  # a detector that sees one box at its tile's origin
        return [{"boxes": torch.tensor([[0.0, 0.0, 4.0, 4.0]]), "scores": torch.tensor([0.5]),
                 "labels": torch.tensor([1])} for _ in tiles]

    frames = task.to_device(task.collate([val[0]]), torch.device("cpu"))
    out = task.predict(model, frames)  # type: ignore[arg-type]
    assert sum(calls) == 6  # 120x80 in 48 px tiles at 0.25 overlap: 3 x 2
    origins = sorted(tuple(b[:2]) for b in out[0]["boxes"].tolist())
    assert origins == sorted((float(x), float(y)) for x in (0, 36, 72) for y in (0, 32))


def scripted_clock(rates: list[float], samples: int) -> Callable[[], float]:
    """A clock under which the loader's timed stretch at the k-th worker count takes samples / rates[k] seconds
    (measure_workers reads it twice a count: before and after), so the choice is tested on given rates, not on
    what a busy machine happens to measure."""
    ticks = iter(t for r in rates for t in (0.0, samples / r))
    return lambda: next(ticks)


def test_measure_picks_the_fewest_workers_that_feed_best() -> None:
    # Before: workers were a default (2) or a rule (cores - 1), never measured.
    from torch.utils.data import Dataset

    from musubi.worker.feed.loader_probe import candidates, measure_workers

    class Items(Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> int:
            return i

    assert candidates(7) == [1, 2, 4, 7] and candidates(1) == [1] and candidates(0) == [1]
    timed = 4 * 3  # batch 4, batches 3: the first batch (start-up) is not timed, the next 3 are

    def choose(rates: list[float]) -> tuple[int, dict[int, float]]:
        return measure_workers(Items(), list, batch=4, max_workers=4, batches=3, clock=scripted_clock(rates, timed))

    # decode-bound: every doubling pays, the most workers win
    chosen, rates = choose([40.0, 78.0, 150.0])
    assert chosen == 4 and rates == pytest.approx({1: 40.0, 2: 78.0, 4: 150.0})
    # the rates a loaded machine measured once ({1: 39.5, 2: 48.5, 4: 55.9}): each doubling gained over GAIN, 4 wins
    chosen, rates = choose([39.5, 48.5, 55.9])
    assert chosen == 4 and list(rates) == [1, 2, 4]
    # saturated at 4: its gain under GAIN over 2 ends the search, and 2 is within KEEP of the best: the fewest
    # that feed best
    chosen, rates = choose([39.5, 54.0, 55.9])
    assert chosen == 2 and rates[4] == pytest.approx(55.9)
    # every count measures the same rate: no gain from 2, the search stops, the fewest win
    chosen, rates = choose([50.0, 50.0, 50.0])
    assert chosen == 1 and list(rates) == [1, 2]
    # the real clock on this machine: only what cannot depend on its load
    chosen, rates = measure_workers(Items(), list, batch=4, max_workers=4, batches=3)
    assert chosen in rates and set(rates) <= {1, 2, 4} and all(r > 0 for r in rates.values())


def test_the_feeder_line_says_where_the_work_runs_without_workers() -> None:
    """0 loader workers (the default on a 1-core rank): the rank decodes, not "loader workers"; a CPU rank's line
    says nothing of pinned memory (there is no copy to a GPU)."""
    from musubi.worker.feed.loader_plan import LoaderPlan
    from musubi.worker.feed.loaders import feeder_line

    path = {"decode": "loader workers", "resize": "loader workers", "augment": "none"}
    assert feeder_line(LoaderPlan(0, False, 4, True, "config", path), False) == \
        "decode, resize in the rank (no loader worker); augment none"
    assert feeder_line(LoaderPlan(2, True, 4, True, "config", path), True) == \
        "decode loader workers; resize loader workers; augment none; 2 loader worker(s) (config), prefetch 4 a " \
        "worker, pinned host memory"
