"""A detector's decisions, as parity judges them: its cuts (score threshold, NMS, top-k) and, for torchvision's
two-stage R-CNNs, a probe of the proposals its RPN hands the box head and a replay of that head on given ones.

An R-CNN decides twice: the RPN keeps the top proposals by objectness (per level, then NMS at 0.7, then its
post-NMS top-n) and the box head decides again on what it was given. An untrained RPN scores whole regions
alike, so two anchors tie exactly and torch and ONNX Runtime keep different ones; the box head then returns
a detection on one side that no decision at the output explains. The probe and the replay show it: the
proposals differ only at the RPN's near-ties, and torch's box head on ONNX Runtime's proposals gives
ONNX Runtime's detections.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import numpy as np
import torch
from torch import Tensor, nn
from torchvision.models.detection.fcos import FCOS
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from torchvision.models.detection.retinanet import RetinaNet
from torchvision.models.detection.ssd import SSD

from musubi.evaluate.parity import Cuts
from musubi.tasks.detection_cap import model_cap
from musubi.tasks.detr import DetrDetector
from musubi.tasks.efficientdet import EffDetDetector

#: effdet's generate_detections: batched NMS at IoU 0.5 (soft NMS rescores instead: no IoU edge to judge).
EFFDET_NMS_IOU = 0.5
#: Output names of the proposal probe graph: the detector's three, then the RPN's proposals and objectness.
PROBE_OUTPUTS = ["boxes", "scores", "labels", "proposals", "objectness"]


def _detector(module: nn.Module) -> nn.Module:
    """The detector inside an export wrapper (DetectorForExport holds it as `.detector`)."""
    return getattr(module, "detector", module)


def detector_cuts(module: nn.Module) -> Cuts:
    """The score threshold, NMS IoU and top-k of a detector's post-processing (defaults where unknown)."""
    det = _detector(module)
    top_k = model_cap(det)[0]
    if isinstance(det, GeneralizedRCNN):
        heads = det.roi_heads  # not det.rpn's score_thresh (0.0): the box head decides what is returned
        return Cuts(float(heads.score_thresh), top_k, float(heads.nms_thresh))
    if isinstance(det, (RetinaNet, FCOS, SSD)):
        return Cuts(float(det.score_thresh), top_k, float(det.nms_thresh))
    if isinstance(det, EffDetDetector):
        return Cuts(0.0, top_k, None if bool(det.config.soft_nms) else EFFDET_NMS_IOU)
    if isinstance(det, DetrDetector):
        return Cuts(0.0, top_k, None)  # the top-k (query, class) pairs: no NMS
    return Cuts(0.0, top_k, None)


def rpn_cuts(module: nn.Module) -> Cuts:
    """The RPN's cuts: objectness threshold, post-NMS top-n and NMS IoU (per level; judged over all boxes)."""
    rpn = _detector(module).rpn
    return Cuts(float(rpn.score_thresh), int(rpn.post_nms_top_n()), float(rpn.nms_thresh), class_aware=False)


class ProposalProbe(nn.Module):
    """A copy of an R-CNN as a tensor function that also returns its RPN's proposals [P,4] (in the resized
    image's pixels) and their objectness [P]: one image [1,3,H,W] in, PROBE_OUTPUTS out."""

    def __init__(self, detector: GeneralizedRCNN) -> None:
        super().__init__()
        self.detector = copy.deepcopy(detector).eval()
        rpn = self.detector.rpn
        keep = rpn.filter_proposals
        stash: list[tuple[list[Tensor], list[Tensor]]] = []

        def filter_proposals(*args: object, **kwargs: object) -> tuple[list[Tensor], list[Tensor]]:
            out = keep(*args, **kwargs)
            stash[:] = [out]  # torchvision's RPN returns the boxes and drops their scores: kept for the probe
            return out

        rpn.filter_proposals = filter_proposals
        self.stash = stash
        self.eval()  # a new module starts in train mode, and torch.onnx.export restores the mode it found

    def forward(self, images: Tensor) -> tuple[Tensor, ...]:
        det = self.detector(list(images.unbind(0)))[0]
        boxes, scores = self.stash[0]
        return det["boxes"], det["scores"], det["labels"], boxes[0], scores[0]


def proposal_probe(module: nn.Module) -> ProposalProbe | None:
    """The probe of an export plan's module when it is a torchvision R-CNN, else None."""
    det = _detector(module)
    return ProposalProbe(det) if isinstance(det, GeneralizedRCNN) else None


@torch.no_grad()
def replay_box_head(module: nn.Module, image: Tensor, proposals: np.ndarray) -> tuple[np.ndarray, ...]:
    """torch's R-CNN on one image [1,3,H,W] with its RPN's proposals replaced by `proposals` [P,4] (resized
    image pixels): GeneralizedRCNN.forward's own steps, the RPN's left out. Returns boxes, scores, labels."""
    det = _detector(module)
    images = list(image.unbind(0))
    original = [(int(im.shape[-2]), int(im.shape[-1])) for im in images]
    batch, _ = det.transform(images)
    features = det.backbone(batch.tensors)
    if isinstance(features, Tensor):
        features = OrderedDict([("0", features)])
    given = [torch.as_tensor(np.asarray(proposals), dtype=batch.tensors.dtype)]
    out, _ = det.roi_heads(features, given, batch.image_sizes)
    out = det.transform.postprocess(out, batch.image_sizes, original)[0]
    return out["boxes"].numpy(), out["scores"].numpy(), out["labels"].numpy()
