"""Detection parity on hand-made torch and ONNX Runtime outputs: every difference a decision boundary explains
(score threshold, top-k cut, NMS near-ties, an R-CNN's proposals) passes and is counted; a real disagreement
is refused with the detections named. Also: the cuts read from torchvision detectors, the R-CNN probe/replay."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from musubi.evaluate.parity import Cuts, compare_detections, explain_by_proposals, judge_detections

NMS = Cuts(score_threshold=0.05, top_k=None, nms_iou=0.5)
SAME = {"map50": 0.4, "map": 0.2}


def dets(boxes: list[list[float]], scores: list[float], labels: list[int]) -> tuple[np.ndarray, ...]:
    """One input's detections as a detector graph returns them: float32 boxes and scores, int64 labels."""
    return np.array(boxes, np.float32).reshape(-1, 4), np.array(scores, np.float32), np.array(labels, np.int64)


def row(i: int) -> list[float]:
    """The i-th of a row of 20 px boxes, 30 px apart: no two overlap."""
    return [i * 30.0, 0.0, i * 30.0 + 20, 20.0]


def base(n: int = 10) -> tuple[np.ndarray, ...]:
    return dets([row(i) for i in range(n)], [0.9 - 0.05 * i for i in range(n)], [1] * n)


def noisy(d: tuple[np.ndarray, ...]) -> tuple[list[list[float]], list[float], list[int]]:
    """The same detections as lists, moved by fp32-kernel noise (1e-4 px, 3e-8 in score)."""
    return [[v + 1e-4 for v in b] for b in d[0].tolist()], [s + 3e-8 for s in d[1].tolist()], d[2].tolist()


def test_exact_match_in_any_order() -> None:
    ref = base()
    boxes, scores, labels = noisy(ref)
    got = dets(boxes[::-1], scores[::-1], labels[::-1])
    out = compare_detections(ref, got, NMS)
    assert out["ok"] and out["exact"] == out["matched"] == 10 and out["kinds"] == {} and out["differences"] == []
    assert 0 < out["max_box_diff_px"] < 1e-3
    verdict = judge_detections([out, out], {"torch": SAME, "onnx": SAME})
    assert verdict["ok"] and verdict["exact"] == 20 and verdict["explained"] == 0 and "disagreements" not in verdict


def test_nms_tie_swap_is_explained_but_not_every_box() -> None:
    """Two near-duplicates with tied scores: NMS kept the other one (boxes 1.6 px apart); tolerated and
    recorded. Every box moved at the same scores is a graph that computes other boxes: refused."""
    ref = base(20)
    boxes, scores, labels = noisy(ref)
    boxes[7] = [v + 1.6 for v in boxes[7]]
    out = compare_detections(ref, dets(boxes, scores, labels), NMS)
    assert out["ok"] and out["exact"] == 19 and out["kinds"] == {"nms_tie": 1}
    (diff,) = out["differences"]
    assert diff["side"] == "both" and diff["onnx_box"][0] == pytest.approx(211.6, abs=1e-3) and "tied" in diff["why"]
    verdict = judge_detections([out], {"torch": SAME, "onnx": SAME})
    assert verdict["ok"] and verdict["kinds"] == {"nms_tie": 1} and verdict["differences"][0]["image"] == 0
    moved = dets([[v + 1.0 for v in b] for b in ref[0].tolist()], ref[1].tolist(), ref[2].tolist())
    verdict = judge_detections([compare_detections(ref, moved, NMS)], None)
    assert not verdict["ok"] and "20 of 20 matched detections kept another box at a tied score" in verdict["problem"]
    # Every box moved far (IoU 0) at the same scores: no pair, each a tie with another box; too many to be ties.
    ref = base(15)
    far = dets([[v + 600.0 for v in b] for b in ref[0].tolist()], ref[1].tolist(), ref[2].tolist())
    verdict = judge_detections([compare_detections(ref, far, NMS)], None)
    assert verdict["kinds"] == {"order_tie": 30} and not verdict["ok"] and "15 of 0 matched" in verdict["problem"]


def test_nms_iou_edge_and_chain() -> None:
    """torch keeps B beside A at IoU 0.4998 (under 0.5); ONNX Runtime's boxes put it at 0.5002 and suppress it:
    an IoU tie with the NMS threshold. The same box overlapping A at IoU 0.6 would be a real disagreement."""
    a = [0.0, 0.0, 100.0, 100.0]
    # B shifted right by w: IoU = (100 - w) / (100 + w) = 0.4998 -> w = 33.3422...
    w = 100 * (1 - 0.4998) / (1 + 0.4998)
    b = [w, 0.0, 100.0 + w, 100.0]
    ref = dets([a, b, row(5)], [0.9, 0.8, 0.5], [1, 1, 1])
    got = dets([a, row(5)], [0.9, 0.5], [1, 1])
    out = compare_detections(ref, got, NMS)
    assert out["ok"] and out["kinds"] == {"nms_iou_edge": 1}, out["differences"]
    assert "IoU 0.4998" in out["differences"][0]["why"]
    far = [25.0, 0.0, 125.0, 100.0]  # IoU 0.6: NMS at 0.5 suppresses it on either side, so torch kept it for real
    out = compare_detections(dets([a, far, row(5)], [0.9, 0.8, 0.5], [1, 1, 1]), got, NMS)
    assert not out["ok"] and out["kinds"] == {"unpaired": 1}
    # A chain: ONNX Runtime kept the tied twin A' of A (shifted 12 px) whose IoU with C is 0.6, so C is gone
    # there; torch's A overlaps C at 0.45 and keeps it. C is explained by the swap it follows from.
    a2 = [12.0, 0.0, 112.0, 100.0]
    c = [40.0, 0.0, 140.0, 100.0]  # IoU(A, C) = 60/140 = 0.43; IoU(A', C) = 72/128 = 0.56
    ref = dets([a, c], [0.9, 0.7], [1, 1])
    got = dets([a2], [0.9 + 3e-8], [1])
    out = compare_detections(ref, got, NMS)
    assert out["ok"] and out["kinds"] == {"nms_tie": 1, "nms_chain": 1}, out["differences"]


def test_top_k_cut_and_score_threshold() -> None:
    """ONNX Runtime keeps one more box at an NMS IoU edge, so its top-3 cut drops torch's last: both explained.
    Without a full list on ONNX Runtime's side, the lost box is real. A box whose score ties the threshold is
    kept on one side only: explained; the same box scoring 0.06 is real."""
    a, w = [0.0, 0.0, 100.0, 100.0], 100 * (1 - 0.5003) / (1 + 0.5003)
    edge = [w, 0.0, 100.0 + w, 100.0]  # IoU 0.5003 with A: suppressed in torch, kept in ONNX Runtime
    ref = dets([a, row(5), row(6)], [0.9, 0.6, 0.3], [1, 1, 1])
    got = dets([a, edge, row(5)], [0.9, 0.8, 0.6], [1, 1, 1])
    out = compare_detections(ref, got, Cuts(0.05, 3, 0.5))
    assert out["ok"] and out["kinds"] == {"nms_iou_edge": 1, "top_k": 1}, out["differences"]
    out = compare_detections(ref, got, Cuts(0.05, 100, 0.5))
    assert not out["ok"] and out["kinds"]["unpaired"] == 1
    ref = dets([row(0), row(1)], [0.9, 0.0500001], [1, 2])
    got = dets([row(0)], [0.9], [1])
    out = compare_detections(ref, got, NMS)
    assert out["ok"] and out["kinds"] == {"score_threshold": 1} and "ties the score threshold 0.05" in \
        out["differences"][0]["why"]
    out = compare_detections(dets([row(0), row(1)], [0.9, 0.06], [1, 2]), got, NMS)
    assert not out["ok"] and out["kinds"] == {"unpaired": 1}


def test_order_tie_of_two_candidates() -> None:
    """Two candidates of one class whose scores tie (1e-8 apart) far apart in the image: each side's top-k kept
    another one. Explained; 0.01 apart, real."""
    ref = dets([row(0), row(1)], [0.9, 0.4], [1, 1])
    got = dets([row(0), row(4)], [0.9, 0.40000001], [1, 1])
    out = compare_detections(ref, got, Cuts(0.05, 100, 0.5))
    assert out["ok"] and out["kinds"] == {"order_tie": 2}
    out = compare_detections(ref, dets([row(0), row(4)], [0.9, 0.41], [1, 1]), Cuts(0.05, 100, 0.5))
    assert not out["ok"] and out["kinds"] == {"unpaired": 2}


def test_real_disagreements_are_refused_and_named() -> None:
    """A box moved 3 px with its score changed, and a box whose class changed: refused, each named (image,
    class with its name, score, box) in the problem and listed in full under `disagreements`."""
    ref = base(5)
    boxes, scores, labels = noisy(ref)
    boxes[2] = [v + 3.0 for v in boxes[2]]
    scores[2] -= 0.05
    labels[4] = 2
    out = compare_detections(ref, dets(boxes, scores, labels), NMS)
    assert not out["ok"] and out["kinds"] == {"box_moved": 1, "class_changed": 1}, out["differences"]
    verdict = judge_detections([compare_detections(ref, ref, NMS), out], {"torch": SAME, "onnx": SAME},
                               names=["person", "car"], images=[11, 12])
    assert not verdict["ok"] and verdict["kinds"] == {"box_moved": 1, "class_changed": 1}
    problem = verdict["problem"]
    assert problem.startswith("2 real disagreement(s) that no score threshold, top-k cut or NMS near-tie explains")
    assert "image 1 (image_id 12) class 1 'person' score 0.8 box [60.0, 0.0, 80.0, 20.0] (torch; ONNX Runtime " \
           "class 1 'person' score 0.75 box [63.0" in problem
    assert "class 1 'person' score 0.7 box [120.0, 0.0, 140.0, 20.0] (torch; ONNX Runtime class 2 'car'" in problem
    assert "\n" not in problem
    listed = verdict["disagreements"]
    assert [(d["image"], d["image_id"], d["kind"], d["name"]) for d in listed] == [
        (1, 12, "box_moved", "person"), (1, 12, "class_changed", "person")]
    assert listed[1]["onnx_label"] == 2 and "class 2 in ONNX Runtime" in listed[1]["why"]


def test_unequal_metric_refuses_explained_differences() -> None:
    ref = base(20)
    boxes, scores, labels = noisy(ref)
    boxes[7] = [v + 1.6 for v in boxes[7]]
    out = compare_detections(ref, dets(boxes, scores, labels), NMS)
    verdict = judge_detections([out], {"torch": SAME, "onnx": {"map50": 0.3, "map": 0.2}})
    assert not verdict["ok"] and verdict["problem"].startswith("map50 0.3000 (ONNX) vs 0.4000 (torch)")


def test_differences_upstream_of_the_box_head() -> None:
    """An R-CNN's output difference with no output-level explanation passes only when the proposals differ at
    the RPN's own ties and torch's box head on ONNX Runtime's proposals gives ONNX Runtime's detections."""
    ref = base(5)
    boxes, scores, labels = noisy(ref)
    boxes[3], scores[3] = [v + 40 for v in boxes[3]], scores[3] - 0.0007  # another proposal, another detection
    result = compare_detections(ref, dets(boxes, scores, labels), NMS)
    assert not result["ok"]
    objectness = [0.49884152, 0.4988] + [0.4987 - 1e-4 * i for i in range(8)]
    props_ref = dets([row(i) for i in range(10)], objectness, [0] * 10)
    props_got = dets([row(0), row(19)] + [row(i) for i in range(2, 10)], [objectness[0], objectness[1] + 1e-8]
                     + objectness[2:], [0] * 10)
    rpn = Cuts(0.0, 150, 0.7, class_aware=False)
    proposals = compare_detections(props_ref, props_got, rpn)
    assert proposals["ok"] and proposals["kinds"] == {"order_tie": 2}
    replay = compare_detections(dets(boxes, scores, labels), dets(boxes, scores, labels), NMS)
    out = explain_by_proposals(result, proposals, replay, same_graph=True)
    assert out["ok"] and set(out["kinds"]) == {"proposals"} and out["proposals"]["replay_exact"] == 5
    assert "the RPN kept other proposals at its own near-ties (2 proposal difference(s): 2 order_tie)" in \
        out["differences"][0]["why"]
    # Every proposal moved at equal objectness: ties, each, but a graph that computes other proposals.
    moved = dets([row(i + 10) for i in range(10)], props_ref[1].tolist(), [0] * 10)
    assert compare_detections(props_ref, moved, rpn)["ok"]
    assert not explain_by_proposals(result, compare_detections(props_ref, moved, rpn), replay, True)["ok"]
    for same, props, again in ((False, proposals, replay),  # the probe graph is not the shipped graph
                               (True, compare_detections(props_ref, dets([row(0)], [0.5], [0]), rpn), replay),
                               (True, proposals, compare_detections(ref, dets(boxes, scores, labels), NMS))):
        assert not explain_by_proposals(result, props, again, same)["ok"]


@pytest.fixture(scope="module")
def rcnn() -> torch.nn.Module:
    """An untrained Faster R-CNN 320 (no weights downloaded), small: 64 px frames, few proposals."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    from musubi.evaluate.export_plan import DetectorForExport

    torch.manual_seed(0)
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=3, min_size=64,
                                                  max_size=96, rpn_pre_nms_top_n_test=60, rpn_post_nms_top_n_test=30,
                                                  box_score_thresh=0.0)
    return DetectorForExport(model).eval()


def test_cuts_of_torchvision_detectors(rcnn: torch.nn.Module) -> None:
    """The box head's threshold, NMS and cap decide what an R-CNN returns (not its RPN's 0.0 threshold)."""
    from torchvision.models.detection import retinanet_resnet50_fpn

    from musubi.evaluate.detector_stages import detector_cuts, rpn_cuts

    assert detector_cuts(rcnn) == Cuts(0.0, 100, 0.5)
    assert rpn_cuts(rcnn) == Cuts(0.05, 30, 0.7, class_aware=False)  # the 320 model's rpn_score_thresh
    retina = retinanet_resnet50_fpn(weights=None, weights_backbone=None, num_classes=3, score_thresh=0.2,
                                    detections_per_img=50)
    assert detector_cuts(retina) == Cuts(0.2, 50, 0.5)


def test_proposal_probe_and_replay(rcnn: torch.nn.Module) -> None:
    """The probe returns the detector's own detections and its proposals; torch's box head replayed on those
    proposals gives the same detections again (the replay is the forward, the RPN left out)."""
    from musubi.evaluate.detector_stages import proposal_probe, replay_box_head

    torch.manual_seed(1)
    x = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        own = [t.numpy() for t in rcnn(x)]
        probe = proposal_probe(rcnn)
        assert probe is not None and not probe.training
        boxes, scores, labels, proposals, objectness = (t.numpy() for t in probe(x))
    assert proposals.shape == (30, 4) and objectness.shape == (30,) and len(own[0]) > 0
    assert all(np.array_equal(a, b) for a, b in zip((boxes, scores, labels), own, strict=True))
    again = replay_box_head(rcnn, x, proposals)
    assert all(np.array_equal(a, b) for a, b in zip(again, own, strict=True))
    # Other proposals give other detections: the replay really uses the ones it is given.
    assert not np.array_equal(replay_box_head(rcnn, x, proposals[::2])[0], own[0])
