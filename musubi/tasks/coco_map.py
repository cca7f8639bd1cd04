"""COCO box mAP of per-image detections, scored by the COCO-eval backend itself (faster-coco-eval or pycocotools).

Same numbers, bit for bit, as torchmetrics' `MeanAveragePrecision(box_format="xyxy", iou_type="bbox")`
(1.9) with the same backend, without importing torchmetrics: its `__init__` imports every domain (audio,
image, text; scipy, transformers checks): seconds per process on top of torch and torchvision, paid by
every rank of every detection validation, against a negligible import of faster-coco-eval or pycocotools
alone (BENCHMARKS.md, evaluation). That metric only builds the two COCO datasets below and runs the
backend's COCOeval; tests/tasks/test_coco_map.py compares every returned value with it.

One difference, on purpose: mAP scores every detection of an image by default, not COCO's top 100. A dense
scene (an aerial frame with 279 trees) scored with its own ground truth as predictions gets mAP50 0.356
under the top 100 and 1.0 here. `max_detections` (the job's eval.max_detections) brings a cap back;
with at most 100 detections an image, or max_detections=100, the numbers are torchmetrics' exactly.
The summary is read from the backend's precision/recall tables as pycocotools' `summarize` reads them
(the two backends' `summarize` disagree on which column a cap other than 100 reads).
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import torch
from torch import Tensor

# torchmetrics' thresholds: float32 linspaces read back as Python floats (0.55 is 0.550000011920929),
# not COCO's float64 ones; kept so that the numbers stay those of torchmetrics and of earlier runs.
IOU_THRESHOLDS: list[float] = torch.linspace(0.5, 0.95, 10).tolist()
RECALL_THRESHOLDS: list[float] = torch.linspace(0.0, 1.0, 101).tolist()
#: COCO's detections per image (mAR at 1, 10, 100; its mAP keeps the top 100 by score).
MAX_DETECTIONS = [1, 10, 100]
#: Our names of the values we report, in COCOeval.stats' order.
STATS = ("map", "map50", "map75", "map_small", "map_medium", "map_large", "mar100")
#: How each is read from the precision [T, R, K, A, M] or recall [T, K, A, M] table: (precision?, IoU
#: threshold or None for all, area range, "cap" for mAP's detections per image or 100 for mAR100).
_READS: dict[str, tuple[bool, float | None, str, str | int]] = {
    "map": (True, None, "all", "cap"), "map50": (True, 0.5, "all", "cap"), "map75": (True, 0.75, "all", "cap"),
    "map_small": (True, None, "small", "cap"), "map_medium": (True, None, "medium", "cap"),
    "map_large": (True, None, "large", "cap"), "mar100": (False, None, "all", 100),
}


def map_detections_cap(preds: list[dict[str, Tensor]], max_detections: int | None) -> int:
    """Detections per image that mAP scores: `max_detections`, or (None) the most any image has, at least 100."""
    if max_detections is not None:
        return int(max_detections)
    return max([100, *(len(p["scores"]) for p in preds)])


def coco_dataset(boxes: list[Tensor], labels: list[Tensor], categories: list[int],
                 scores: list[Tensor] | None = None) -> dict[str, Any]:
    """One COCO dataset dict: image i of the lists has id i, boxes [N, 4] xyxy become xywh, area = w * h.

    Every image is listed, with or without boxes; annotation ids count from 1 (COCOeval needs them
    non-zero); no crowds. With `scores` it is the detections' dataset.
    """
    images, annotations = [], []
    for image_id, (image_boxes, image_labels) in enumerate(zip(boxes, labels, strict=True)):
        images.append({"id": image_id})
        x1, y1, x2, y2 = image_boxes.reshape(-1, 4).unbind(-1)
        # w and h in the boxes' dtype (torchvision's box_convert, as torchmetrics), the area in Python floats.
        xywh = torch.stack((x1, y1, x2 - x1, y2 - y1), -1).tolist()
        image_scores = scores[image_id].tolist() if scores is not None else None
        for k, (box, label) in enumerate(zip(xywh, image_labels.tolist(), strict=True)):
            annotation = {"id": len(annotations) + 1, "image_id": image_id, "area": box[2] * box[3],
                          "category_id": label, "iscrowd": 0, "bbox": box}
            if image_scores is not None:
                annotation["score"] = image_scores[k]
            annotations.append(annotation)
    return {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": c, "name": str(c)} for c in categories],
    }


def coco_map(preds: list[dict[str, Tensor]], targets: list[dict[str, Tensor]], backend: str,
             max_detections: int | None = None) -> dict[str, float]:
    """mAP (50-95, 50, 75, by size) and mAR100 of `preds` ({"boxes" xyxy, "scores", "labels"} per image) against
    `targets` ({"boxes" xyxy, "labels"}); -1 where COCO eval has no ground truth, every value -1 without images.

    `backend` is "faster_coco_eval" or "pycocotools" (detection.map_backend). mAP scores the top
    `max_detections` detections of each image by score, every detection when None; mAR100 the top 100.
    Values are rounded to float32, as torchmetrics returns them.
    """
    if len(preds) != len(targets):
        raise ValueError(f"coco_map: {len(preds)} prediction entries for {len(targets)} images")
    if not targets:
        return dict.fromkeys(STATS, -1.0)
    if backend == "faster_coco_eval":
        from faster_coco_eval import COCO
        from faster_coco_eval import COCOeval_faster as COCOeval
    elif backend == "pycocotools":
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    else:
        raise ValueError(f"coco_map: backend {backend!r} is neither 'faster_coco_eval' nor 'pycocotools'")
    # Every class seen in the predictions or the ground truth, ascending (a class only predicted counts too).
    categories = sorted({c for d in (*preds, *targets) for c in d["labels"].tolist()})
    with contextlib.redirect_stdout(io.StringIO()):  # both backends print progress and the summary table
        coco_target, coco_preds = COCO(), COCO()
        coco_target.dataset = coco_dataset([t["boxes"] for t in targets], [t["labels"] for t in targets],
                                           categories)
        coco_preds.dataset = coco_dataset([p["boxes"] for p in preds], [p["labels"] for p in preds],
                                          categories, scores=[p["scores"] for p in preds])
        coco_target.createIndex()
        coco_preds.createIndex()
        evaluator = COCOeval(coco_target, coco_preds, iouType="bbox")
        evaluator.params.iouThrs = np.array(IOU_THRESHOLDS, dtype=np.float64)
        evaluator.params.recThrs = np.array(RECALL_THRESHOLDS, dtype=np.float64)
        cap = map_detections_cap(preds, max_detections)
        # Ascending: the backends evaluate each image's top maxDets[-1] and accumulate each column apart.
        # Matching is greedy in score order, so the column of 100 is the same whatever the larger cap.
        evaluator.params.maxDets = sorted({*MAX_DETECTIONS, cap})
        evaluator.evaluate()
        evaluator.accumulate()
    return summary(evaluator.eval, evaluator.params, cap)


def summary(tables: dict[str, Any], params: Any, cap: int) -> dict[str, float]:
    """Our values from COCOeval's accumulated tables, each the mean of its entries that are not -1 (-1 when
    none is), as pycocotools' `summarize` computes them; mAP at `cap` detections per image, mAR at 100."""
    iou = np.asarray(params.iouThrs)
    areas, caps = list(params.areaRngLbl), list(params.maxDets)
    out = {}
    for name, (precision, threshold, area, dets) in _READS.items():
        m = caps.index(cap if dets == "cap" else dets)
        a = areas.index(area)
        s = tables["precision"][:, :, :, a, m] if precision else tables["recall"][:, :, a, m]
        if threshold is not None:
            s = s[np.where(threshold == iou)[0]]
        value = np.mean(s[s > -1]) if (s > -1).any() else -1.0
        out[name] = float(np.float32(value))
    return out
