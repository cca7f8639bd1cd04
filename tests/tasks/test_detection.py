"""Detection task: synthetic data, model building, one train step, and a global mAP over 2 gloo ranks."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.data.synthetic_detection import SyntheticDetection, synthetic_detection_batch
from musubi.tasks import detection
from musubi.tasks.detection import MODELS, DetectionMetric, DetectionTask
from tests.tasks.detector_step import train_step_and_predict

SMALL_MODEL = "fasterrcnn_mobilenet_v3_large_320_fpn"


def _spec(model: str = SMALL_MODEL, **overrides: Any) -> JobSpec:
    synthetic = {
        "image_size": 128,
        "num_classes": 3,
        "objects": 3,
        "min_object": 8,
        "max_object": 32,
        "train_size": 8,
        "val_size": 4,
    }
    fields: dict[str, Any] = {
        "name": "det",
        "task": "detection",
        "model": model,
        "data": {"synthetic": synthetic},
    }
    fields.update(overrides)
    return JobSpec(**fields)


# -- synthetic data ----------------------------------------------------------------
def test_synthetic_is_deterministic_and_seeded() -> None:
    a = SyntheticDetection(4, 96, num_classes=5, objects=6, min_object=4, max_object=20, seed=1)
    b = SyntheticDetection(4, 96, num_classes=5, objects=6, min_object=4, max_object=20, seed=1)
    c = SyntheticDetection(4, 96, num_classes=5, objects=6, min_object=4, max_object=20, seed=2)
    (ia, ta), (ib, tb), (ic, tc) = a[3], b[3], c[3]
    assert (
        torch.equal(ia, ib)
        and torch.equal(ta["boxes"], tb["boxes"])
        and torch.equal(ta["labels"], tb["labels"])
    )
    assert not torch.equal(ia, ic) and not torch.equal(ta["boxes"], tc["boxes"])
    assert not torch.equal(a[0][0], a[1][0])
    # The global RNG is neither used nor disturbed.
    state = torch.get_rng_state()
    a[2]
    assert torch.equal(state, torch.get_rng_state())


def test_synthetic_boxes_inside_with_class_colours() -> None:
    ds = SyntheticDetection(6, 64, num_classes=4, objects=5, min_object=3, max_object=16, seed=0)
    for i in range(len(ds)):
        image, target = ds[i]
        boxes, labels = target["boxes"], target["labels"]
        assert image.shape == (3, 64, 64) and image.dtype == torch.float32
        assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
        assert boxes.dtype == torch.float32 and boxes.shape == (5, 4) and labels.dtype == torch.int64
        assert (boxes[:, :2] >= 0).all() and (boxes[:, 2:] <= 64).all()
        sides = boxes[:, 2:] - boxes[:, :2]
        assert (sides >= 3).all() and (sides <= 16).all()
        assert ((labels >= 1) & (labels <= 4)).all()
    with pytest.raises(ConfigError, match="max_object"):
        SyntheticDetection(1, 32, num_classes=2, objects=1, min_object=4, max_object=32)


def test_device_batch_on_cpu() -> None:
    task = DetectionTask(_spec())
    g = torch.Generator().manual_seed(0)
    images, targets = task.device_batch(3, torch.device("cpu"), g)
    assert len(images) == 3 and task.batch_size_of((images, targets)) == 3
    assert images[0].shape == (3, 128, 128)
    assert all((t["boxes"][:, 2:] <= 128).all() and t["labels"].min() >= 1 for t in targets)
    again = synthetic_detection_batch(
        3,
        image_size=128,
        num_classes=3,
        objects=3,
        min_object=8,
        max_object=32,
        device="cpu",
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(images[2], again[0][2])


# -- task: validation and model building ---------------------------------------------
def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(ConfigError, match="unknown detection model 'yolo'") as info:
        DetectionTask(_spec("yolo")).validate()
    assert all(name in str(info.value) for name in MODELS) and "\n" not in str(info.value)


def test_model_args_checked_before_building() -> None:
    with pytest.raises(ConfigError, match="takes no min_sise"):
        DetectionTask(_spec(model_args={"min_sise": 128})).validate()
    # SSD has a fixed input size; torchvision raises TypeError, reported as a ConfigError.
    with pytest.raises(ConfigError, match="model_args"):
        DetectionTask(_spec("ssdlite320_mobilenet_v3_large", model_args={"min_size": 128})).validate()
    task = DetectionTask(_spec())
    assert task.model_kwargs() == {"min_size": 128, "max_size": 128}  # no upsampling to 320..640 by default
    assert DetectionTask(_spec(model_args={"min_size": 96})).model_kwargs() == {"min_size": 96}
    assert task.image_size == 128 and task.val_dataset() is not None


def test_bn_momentum_sets_every_batchnorm_and_is_checked() -> None:
    ssd = "ssdlite320_mobilenet_v3_large"
    default = DetectionTask(_spec(ssd)).build_model()
    assert {m.momentum for m in default.modules() if isinstance(m, torch.nn.BatchNorm2d)} == {0.03}
    task = DetectionTask(_spec(ssd, model_args={"bn_momentum": 0.1}))
    task.validate()
    assert "bn_momentum" not in task.model_kwargs()  # Musubi's own: never handed to torchvision
    norms = [m for m in task.build_model().modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) > 50 and {m.momentum for m in norms} == {0.1}
    for bad in (0, 1.5, "fast", True):
        with pytest.raises(ConfigError, match=r"model_args.bn_momentum: must be a number in \(0, 1\]"):
            DetectionTask(_spec(ssd, model_args={"bn_momentum": bad})).validate()


def test_weights_round_trip_and_mismatch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = DetectionTask(_spec()).build_model()
    path = tmp_path / "w.pt"
    torch.save(model.state_dict(), path)
    loaded = DetectionTask(_spec(weights=str(path))).build_model()
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True)
    )
    other = _spec(weights=str(path))
    other.data.synthetic.num_classes = 5  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="shape mismatch") as info:
        DetectionTask(other).validate()  # caught on meta tensors, before any real model is built
    assert "\n" not in str(info.value)
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(ConfigError, match="cannot load"):
        DetectionTask(_spec(weights=str(tmp_path / "junk.pt"))).build_model()
    with pytest.raises(ConfigError, match="no such file"):
        DetectionTask(_spec(weights=str(tmp_path / "none.pt"))).validate()


def test_coco_paths_checked(tmp_path: Path) -> None:
    spec = _spec(data={"train": {"path": str(tmp_path / "images")}})
    with pytest.raises(ConfigError, match="data.train.annotations"):
        DetectionTask(spec).validate()
    spec = _spec(data={"train": {"path": str(tmp_path), "annotations": str(tmp_path / "missing.json")}})
    with pytest.raises(ConfigError, match="missing.json: annotation file not found"):
        DetectionTask(spec).validate()


# -- step --------------------------------------------------------------------------
def test_one_train_step_and_predict() -> None:
    torch.manual_seed(0)
    task = DetectionTask(_spec(model_args={"min_size": 128, "max_size": 128}))
    task.validate()
    assert "loss_classifier" in train_step_and_predict(task)


# -- metric ------------------------------------------------------------------------
def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def test_perfect_predictions_give_map50_one() -> None:
    task = DetectionTask(_spec())
    ds = task.val_dataset()
    assert ds is not None
    batch = task.collate([ds[i] for i in range(len(ds))])
    outputs = [
        {"boxes": t["boxes"], "labels": t["labels"], "scores": torch.ones(len(t["labels"]))} for t in batch[1]
    ]
    metric = task.make_metric(torch.device("cpu"))
    metric.update(outputs, batch)
    result = metric.compute(_identity)
    assert result["map50"] == 1.0 and result["map"] == 1.0


def test_missing_eval_extra_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detection, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install 'musubi-train\[eval\]'"):
        DetectionTask(_spec()).make_metric(torch.device("cpu"))


def _fake_image(i: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Image i: ground truth plus imperfect detections (shifted, missed, false positives, spread scores)."""
    g = torch.Generator().manual_seed(100 + i)
    n = 1 + i % 3
    xy = torch.randint(0, 80, (n, 2), generator=g).float()
    gt_boxes = torch.cat([xy, xy + torch.randint(8, 40, (n, 2), generator=g).float()], 1)
    gt_labels = torch.randint(1, 4, (n,), generator=g)
    shift = torch.randint(-6, 7, (n, 4), generator=g).float()
    pred_boxes = torch.cat([gt_boxes + shift, torch.tensor([[1.0, 1.0, 30.0, 30.0]])])
    pred_labels = torch.cat([gt_labels, torch.tensor([1 + i % 3])])
    scores = torch.rand(n + 1, generator=g)
    target = {"boxes": gt_boxes, "labels": gt_labels, "image_id": torch.tensor(i)}
    return {"boxes": pred_boxes, "scores": scores, "labels": pred_labels}, target


def _shard(rank: int) -> list[int]:
    # Uneven on purpose (3 vs 4 images), and rank 1 repeats image 0 as a DistributedSampler pads.
    return [0, 2, 4] if rank == 0 else [1, 3, 5, 0]


def _metric_over(indices: list[int], reduce_sum: Any) -> dict[str, float]:
    metric = DetectionMetric(torch.device("cpu"), detection.map_backend())
    pairs = [_fake_image(i) for i in indices]
    # Two update calls, as a validation loop would make.
    for chunk in (pairs[:2], pairs[2:]):
        metric.update([p for p, _ in chunk], ([], [t for _, t in chunk]))
    return metric.compute(reduce_sum)


def _rank_main(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    try:

        def reduce_sum(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            return t

        result = _metric_over(_shard(rank), reduce_sum)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_distributed_map_equals_single_process(tmp_path: Path) -> None:
    # Forked from a server that imported torch and torchvision once, not 2 interpreters importing them each
    # (~5 s of CPU apiece); fresh processes all the same (not forks of this test process and its threads).
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed", "torchvision"])
    mp.start_processes(_rank_main, args=(str(tmp_path / "pg"), str(tmp_path)), nprocs=2, join=True,
                       start_method="forkserver")
    single = _metric_over(list(range(6)), _identity)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert 0.0 < single["map50"] < 1.0  # a non-trivial score, so a lost or doubled image would show
    assert ranks[0] == ranks[1] == single
