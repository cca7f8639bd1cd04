"""ONNX Runtime against torch on the same inputs: element-wise for tensors, matched for detections."""

from __future__ import annotations

from typing import Any

import numpy as np

#: Element-wise tolerance of an output tensor: |ort - torch| <= ATOL + RTOL * |torch| (fp32 kernels differ).
RTOL, ATOL = 1e-3, 1e-3
#: Detections: box corners within BOX_ATOL_PX pixels, scores within SCORE_ATOL, labels equal.
BOX_ATOL_PX, SCORE_ATOL = 0.5, 1e-3
#: Two detections are the same object when their boxes overlap at least this much (IoU).
MATCH_IOU = 0.5


def compare_tensors(ref: np.ndarray, got: np.ndarray) -> dict[str, Any]:
    """Max abs/rel difference, allclose verdict and (for logits) argmax agreement of two outputs."""
    if ref.shape != got.shape:
        return {"ok": False, "problem": f"shape {list(got.shape)} != torch's {list(ref.shape)}"}
    a, b = ref.astype(np.float64), got.astype(np.float64)
    diff = np.abs(a - b)
    out: dict[str, Any] = {
        "max_abs_diff": float(diff.max(initial=0.0)),
        "max_rel_diff": float((diff / np.maximum(np.abs(a), 1e-6)).max(initial=0.0)),
        "rtol": RTOL,
        "atol": ATOL,
        "ok": bool(np.allclose(b, a, rtol=RTOL, atol=ATOL)),
    }
    if a.ndim >= 2 and a.shape[-1] > 1:
        out["argmax_agreement"] = float((a.argmax(-1) == b.argmax(-1)).mean())
    return out


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one xyxy box [4] with boxes [N,4]."""
    lt = np.maximum(box[:2], boxes[:, :2])
    rb = np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
    area = np.prod(box[2:] - box[:2])
    areas = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
    return inter / np.maximum(area + areas - inter, 1e-9)


def compare_detections(ref: tuple[np.ndarray, ...], got: tuple[np.ndarray, ...],
                       score_floor: float = 0.0) -> dict[str, Any]:
    """Match ORT detections to torch's (same label, best IoU, highest score first) and measure the differences.

    A detection without a partner is tolerated only at a cut, where a near-tie may fall either side:
    its score is within SCORE_ATOL of the detector's score threshold (`score_floor`), or of the
    lowest score the other side kept (where a top-k limit cut it).
    """
    rb, rs, rl = (np.asarray(x) for x in ref)
    gb, gs, gl = (np.asarray(x) for x in got)
    used = np.zeros(len(gs), dtype=bool)
    box_diff, score_diff, matched = 0.0, 0.0, 0
    lost: list[float] = []  # torch detections ORT lacks
    for i in np.argsort(-rs, kind="stable"):
        cand = np.flatnonzero((gl == rl[i]) & ~used)
        if cand.size:
            ious = _iou(rb[i], gb[cand])
            j = cand[int(ious.argmax())]
            if ious.max() >= MATCH_IOU:
                used[j] = True
                matched += 1
                box_diff = max(box_diff, float(np.abs(rb[i] - gb[j]).max()))
                score_diff = max(score_diff, float(abs(rs[i] - gs[j])))
                continue
        lost.append(float(rs[i]))
    extra = [float(s) for s in gs[~used]]  # ORT detections torch lacks

    def at_cut(score: float, other: np.ndarray) -> bool:
        return score <= score_floor + SCORE_ATOL or (other.size > 0 and abs(score - float(other.min())) <= SCORE_ATOL)

    off_cut = [s for s in lost if not at_cut(s, gs)] + [s for s in extra if not at_cut(s, rs)]
    return {
        "torch_detections": len(rs),
        "ort_detections": len(gs),
        "matched": matched,
        "unmatched": len(lost) + len(extra),
        "max_box_diff_px": box_diff,
        "max_score_diff": score_diff,
        "box_atol_px": BOX_ATOL_PX,
        "score_atol": SCORE_ATOL,
        "ok": bool(not off_cut and box_diff <= BOX_ATOL_PX and score_diff <= SCORE_ATOL),
    }


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst case over several inputs' comparisons (max of differences, sum of counts, all ok)."""
    if not results:
        return {"ok": False, "problem": "no inputs compared"}
    out: dict[str, Any] = {"inputs": len(results), "ok": all(r.get("ok") for r in results)}
    problems = [r["problem"] for r in results if "problem" in r]
    if problems:
        out["problem"] = problems[0]
    for key in results[0]:
        values = [r[key] for r in results if key in r]
        if key in ("ok", "problem") or not values:
            continue
        if key.startswith("max_"):
            out[key] = max(values)
        elif key in ("torch_detections", "ort_detections", "matched", "unmatched"):
            out[key] = sum(values)
        elif key == "argmax_agreement":
            out[key] = min(values)
        else:
            out[key] = values[0]  # tolerances: the same for every input
    return out
