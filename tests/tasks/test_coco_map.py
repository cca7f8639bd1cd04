"""coco_map scores exactly what torchmetrics' MeanAveragePrecision scores, with either COCO-eval backend."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch
from torch import Tensor
from torchmetrics.detection import MeanAveragePrecision  # the dev extra's: the reference

from musubi.tasks.coco_map import coco_map
from musubi.tasks.detection import DetectionMetric

BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(find_spec(b) is None, reason=f"{b} not installed"))
            for b in ("faster_coco_eval", "pycocotools")]
#: Their names -> ours.
NAMES = {"map": "map", "map_50": "map50", "map_75": "map75", "map_small": "map_small", "map_medium": "map_medium",
         "map_large": "map_large", "mar_100": "mar100"}
#: Box sides (pixels) drawn per size: COCO's small (< 32^2), medium and large (> 96^2) areas.
SIDES = ((2.0, 31.0), (33.0, 95.0), (100.0, 300.0))


def _boxes(n: int, g: torch.Generator) -> Tensor:
    """n xyxy boxes [n, 4] of every COCO size, at fractional coordinates in a 640-pixel image."""
    size = torch.randint(0, len(SIDES), (n,), generator=g)
    lo = torch.tensor([SIDES[s][0] for s in size.tolist()])
    hi = torch.tensor([SIDES[s][1] for s in size.tolist()])
    wh = lo[:, None] + (hi - lo)[:, None] * torch.rand(n, 2, generator=g)
    xy = torch.rand(n, 2, generator=g) * 320
    return torch.cat([xy, xy + wh], 1)


def _case(seed: int, images: int = 40, classes: int = 4) -> tuple[list[dict[str, Tensor]], list[dict[str, Tensor]]]:
    """Random images: some without ground truth, some without detections, a class only ever predicted
    (`classes`), one image with 150 detections (COCO keeps its top 100); detections are jittered ground
    truth (sometimes of the wrong class) plus false positives, scores with ties."""
    g = torch.Generator().manual_seed(seed)
    preds, targets = [], []
    for i in range(images):
        n_gt = 0 if i % 7 == 3 else int(torch.randint(1, 6, (1,), generator=g))
        gt = _boxes(n_gt, g)
        gt_labels = torch.randint(0, classes, (n_gt,), generator=g)
        targets.append({"boxes": gt, "labels": gt_labels})
        if i % 5 == 2:
            preds.append({"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0).long()})
            continue
        n_fp = 150 if i == 11 else int(torch.randint(0, 4, (1,), generator=g))
        hits = gt[torch.rand(n_gt, generator=g) < 0.8]
        jitter = (torch.rand(len(hits), 4, generator=g) - 0.5) * 0.3 * (hits[:, 2:] - hits[:, :2]).repeat(1, 2)
        boxes = torch.cat([hits + jitter, _boxes(n_fp, g)])
        labels = torch.cat([gt_labels[: len(hits)], torch.randint(0, classes + 1, (n_fp,), generator=g)])
        wrong = torch.rand(len(labels), generator=g) < 0.1
        labels[wrong] = (labels[wrong] + 1) % classes
        scores = torch.rand(len(boxes), generator=g)
        scores[: len(scores) // 4] = 0.5  # ties
        preds.append({"boxes": boxes, "scores": scores, "labels": labels})
    return preds, targets


def _torchmetrics(preds: list[dict[str, Tensor]], targets: list[dict[str, Tensor]], backend: str) -> dict[str, float]:
    metric = MeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend=backend)
    metric.warn_on_many_detections = False
    metric.update(preds, targets)
    result = metric.compute()
    return {ours: float(result[theirs]) for theirs, ours in NAMES.items()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_cases_equal_torchmetrics(seed: int, backend: str) -> None:
    preds, targets = _case(seed)
    ours = coco_map(preds, targets, backend)
    assert ours == _torchmetrics(preds, targets, backend)
    # Non-trivial: every size bucket scored, neither 0 nor 1, so a wrong area or id would show.
    assert all(0.0 < v < 1.0 for v in ours.values()), ours


@pytest.mark.parametrize("backend", BACKENDS)
def test_edge_cases_equal_torchmetrics(backend: str) -> None:
    preds, targets = _case(7, images=12)
    no_preds = [{"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0).long()}] * 12
    no_gt = [{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0).long()}] * 12
    one = ([preds[0]], [targets[0]])
    for p, t in ((no_preds, targets), (preds, no_gt), one, (no_preds, no_gt), ([], [])):
        assert coco_map(p, t, backend) == _torchmetrics(p, t, backend)
    assert coco_map(preds, no_gt, backend)["map50"] == -1.0  # no ground truth: COCO's -1
    assert coco_map(no_preds, targets, backend)["map50"] == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_detection_metric_equals_torchmetrics(backend: str) -> None:
    """Through DetectionMetric (host float32 copies, image ids, a repeated image counted once)."""
    preds, targets = _case(5, images=10)
    metric = DetectionMetric(torch.device("cpu"), backend)
    ids = [*range(10), 0]  # image 0 again, as a DistributedSampler pads
    metric.update([preds[i] for i in ids], ([], [{**targets[i], "image_id": torch.tensor(i)} for i in ids]))
    assert metric.compute(lambda t: t) == _torchmetrics(preds, targets, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_detection_metric_of_no_image_is_every_value_minus_one(backend: str) -> None:
    """A validation that saw no image (a rank's empty shard, merged): every value -1, as torchmetrics says."""
    assert DetectionMetric(torch.device("cpu"), backend).compute(lambda t: t) == _torchmetrics([], [], backend)


def _dense(images: int = 3, objects: int = 320, seed: int = 0) -> list[dict[str, Tensor]]:
    """Images crowded with `objects` boxes of one class (an aerial frame of trees): 8-16 px boxes on a grid."""
    g = torch.Generator().manual_seed(seed)
    side = int(objects**0.5) + 1
    out = []
    for _ in range(images):
        cells = torch.randperm(side * side, generator=g)[:objects]
        xy = torch.stack([cells % side, cells // side], 1).float() * 20 + torch.rand(objects, 2, generator=g) * 3
        wh = 8 + torch.rand(objects, 2, generator=g) * 8
        out.append({"boxes": torch.cat([xy, xy + wh], 1), "labels": torch.ones(objects, dtype=torch.long)})
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_dense_ground_truth_scored_as_predictions_is_one(backend: str) -> None:
    """320 objects an image: the ground truth itself scores mAP50 1.0 (COCO's top-100 cap would give ~0.31)."""
    # Two images: pycocotools matches every box of an image in Python (~0.4 s an image and area range, five
    # evaluations here); the cap and its score are per image, so a third image told nothing more.
    targets = _dense(images=2)
    g = torch.Generator().manual_seed(1)
    preds = [{**t, "scores": torch.rand(len(t["labels"]), generator=g)} for t in targets]
    ours = coco_map(preds, targets, backend)
    assert ours["map50"] == 1.0 and ours["map"] == 1.0
    assert ours["mar100"] < 0.35  # mAR100 keeps COCO's meaning: the top 100 of 320
    capped = coco_map(preds, targets, backend, max_detections=100)
    assert capped["map50"] < 0.35 and capped == _torchmetrics(preds, targets, backend)  # COCO's cap, as theirs
    # Through the validation metric, as the trainer computes it (eval.max_detections unset).
    metric = DetectionMetric(torch.device("cpu"), backend)
    metric.update(preds, ([], [{**t, "image_id": torch.tensor(i)} for i, t in enumerate(targets)]))
    assert metric.compute(lambda t: t)["map50"] == 1.0
    metric = DetectionMetric(torch.device("cpu"), backend, max_detections=100)
    metric.update(preds, ([], [{**t, "image_id": torch.tensor(i)} for i, t in enumerate(targets)]))
    assert metric.compute(lambda t: t)["map50"] == capped["map50"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_than_100_detections_of_a_class_scored_to_the_cap(backend: str) -> None:
    """An image with 150 detections of one class (COCO caps per image and class): the default scores all of
    them, max_detections=100 gives torchmetrics' numbers, and the uncapped numbers are torchmetrics' with
    its cap raised (faster-coco-eval: torchmetrics reads pycocotools' "map" at 100 only)."""
    preds, targets = _case(3, images=12)
    g = torch.Generator().manual_seed(9)
    many = _boxes(150, g)
    preds[4] = {"boxes": torch.cat([targets[4]["boxes"], many]),
                "scores": torch.rand(len(targets[4]["boxes"]) + 150, generator=g),
                "labels": torch.cat([targets[4]["labels"], torch.full((150,), 1)])}
    ours = coco_map(preds, targets, backend)
    capped = coco_map(preds, targets, backend, max_detections=100)
    assert capped == _torchmetrics(preds, targets, backend)
    assert ours != capped and ours["mar100"] == capped["mar100"]
    cap = max(len(p["scores"]) for p in preds)
    if backend == "faster_coco_eval":
        metric = MeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend=backend,
                                      max_detection_thresholds=[1, 10, cap])
        metric.warn_on_many_detections = False
        metric.update(preds, targets)
        theirs = metric.compute()
        assert {k: v for k, v in ours.items() if k != "mar100"} == {
            ours_name: float(theirs[name]) for name, ours_name in NAMES.items() if ours_name != "mar100"}
    else:
        assert ours == coco_map(preds, targets, "faster_coco_eval")
