"""COCO box mAP of per-image detections, scored by the COCO-eval backend itself (faster-coco-eval or pycocotools).

Same numbers, bit for bit, as torchmetrics' `MeanAveragePrecision(box_format="xyxy", iou_type="bbox")`
(1.9) with the same backend, without importing torchmetrics: its `__init__` imports every domain (audio,
image, text; scipy, transformers checks): 2.1 s per process on top of torch and torchvision, measured on the
2-core test machine (2026-11-27), paid by every rank of every detection validation (faster-coco-eval's
and pycocotools' own imports: 0.01 s). That metric only builds the two COCO datasets below and runs the
backend's COCOeval; tests/tasks/test_coco_map.py compares every returned value with it.
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
#: Detections per image scored by the mAR entries (COCO's); mAP uses the last, the top 100 by score.
MAX_DETECTIONS = [1, 10, 100]
#: Our name of each entry of COCOeval.stats that we report, by index.
STATS = {0: "map", 1: "map50", 2: "map75", 3: "map_small", 4: "map_medium", 5: "map_large", 8: "mar100"}


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


def coco_map(preds: list[dict[str, Tensor]], targets: list[dict[str, Tensor]], backend: str) -> dict[str, float]:
    """mAP (50-95, 50, 75, by size) and mAR100 of `preds` ({"boxes" xyxy, "scores", "labels"} per image) against
    `targets` ({"boxes" xyxy, "labels"}); -1 where COCO eval has no ground truth, every value -1 without images.

    `backend` is "faster_coco_eval" or "pycocotools" (detection.map_backend). Values are rounded to float32,
    as torchmetrics returns them.
    """
    if len(preds) != len(targets):
        raise ValueError(f"coco_map: {len(preds)} prediction entries for {len(targets)} images")
    if not targets:
        return dict.fromkeys(STATS.values(), -1.0)
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
        evaluator.params.maxDets = MAX_DETECTIONS
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return {name: float(np.float32(evaluator.stats[i])) for i, name in STATS.items()}
