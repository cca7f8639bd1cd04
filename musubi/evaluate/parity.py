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
#: A matched pair whose boxes differ by more than BOX_ATOL_PX while their scores tie (within SCORE_ATOL) is
#: NMS choosing the other box of a tied near-duplicate pair (fp32 kernels order ties differently): tolerated
#: for up to this share of the matched detections (at least one). Changed weights move nearly every box.
MAX_TIE_SHARE = 0.1
#: mAP50 and mAP50-95 of the ONNX predictions on the parity samples within this of torch's.
MAP_ATOL = 0.01

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


def _match(rb: np.ndarray, rs: np.ndarray, rl: np.ndarray, gb: np.ndarray, gs: np.ndarray,
           gl: np.ndarray) -> list[tuple[int, int]]:
    """Greedy pairs (torch index, ORT index), torch's highest score first: same label, IoU >= MATCH_IOU,
    a partner with a tied score preferred (so a swapped near-duplicate pairs with its twin), then best IoU."""
    used = np.zeros(len(gs), dtype=bool)
    pairs = []
    for i in np.argsort(-rs, kind="stable"):
        cand = np.flatnonzero((gl == rl[i]) & ~used)
        if not cand.size:
            continue
        ious = _iou(rb[i], gb[cand])
        close = ious >= MATCH_IOU
        if not close.any():
            continue
        tied = close & (np.abs(gs[cand] - rs[i]) <= SCORE_ATOL)
        pool = tied if tied.any() else close
        j = cand[int(np.where(pool, ious, -1.0).argmax())]
        used[j] = True
        pairs.append((int(i), int(j)))
    return pairs


def compare_detections(ref: tuple[np.ndarray, ...], got: tuple[np.ndarray, ...],
                       score_floor: float = 0.0) -> dict[str, Any]:
    """Pair ORT detections with torch's on one input and count how each pair agrees.

    `exact`: boxes within BOX_ATOL_PX and scores within SCORE_ATOL. `nms_ties`: scores tie but the boxes
    differ more (NMS kept the other box of a near-duplicate pair; judged by `judge_detections`).
    `score_mismatch`: same object, different score: a divergence. A detection without a partner is
    tolerated only at a cut, where a near-tie may fall either side: its score is within SCORE_ATOL of
    the detector's score threshold (`score_floor`) or of the lowest score the other side kept (top-k).
    `ok` is False on a divergence this input shows by itself.
    """
    rb, rs, rl = (np.asarray(x) for x in ref)
    gb, gs, gl = (np.asarray(x) for x in got)
    pairs = _match(rb, rs, rl, gb, gs, gl)
    exact = ties = mismatched = 0
    box_diff = tie_box_diff = score_diff = 0.0
    for i, j in pairs:
        d_box = float(np.abs(rb[i] - gb[j]).max())
        d_score = float(abs(rs[i] - gs[j]))
        score_diff = max(score_diff, d_score)
        if d_score > SCORE_ATOL:
            mismatched += 1
        elif d_box <= BOX_ATOL_PX:
            exact += 1
            box_diff = max(box_diff, d_box)
        else:
            ties += 1
            tie_box_diff = max(tie_box_diff, d_box)
    lost = [float(s) for s in np.delete(rs, [i for i, _ in pairs])]  # torch detections ORT lacks
    extra = [float(s) for s in np.delete(gs, [j for _, j in pairs])]  # ORT detections torch lacks

    def at_cut(score: float, other: np.ndarray) -> bool:
        return score <= score_floor + SCORE_ATOL or (other.size > 0 and abs(score - float(other.min())) <= SCORE_ATOL)

    off_cut = [s for s in lost if not at_cut(s, gs)] + [s for s in extra if not at_cut(s, rs)]
    return {
        "torch_detections": len(rs),
        "ort_detections": len(gs),
        "matched": len(pairs),
        "exact": exact,
        "nms_ties": ties,
        "score_mismatch": mismatched,
        "unmatched": len(lost) + len(extra),
        "unmatched_off_cut": len(off_cut),
        "max_box_diff_px": box_diff,
        "max_tie_box_diff_px": tie_box_diff,
        "max_score_diff": score_diff,
        "box_atol_px": BOX_ATOL_PX,
        "score_atol": SCORE_ATOL,
        "ok": not off_cut and not mismatched,
    }


def judge_detections(results: list[dict[str, Any]], maps: dict[str, dict[str, float]] | None) -> dict[str, Any]:
    """Detection parity over the samples: no divergence on any input, NMS ties within MAX_TIE_SHARE of the
    matched detections, and (with ground truth) mAP of the ONNX predictions within MAP_ATOL of torch's.

    `maps`: {"torch": {"map50": .., "map": ..}, "onnx": {...}} on the same samples, or None.
    """
    out = merge(results)
    problems = []
    if out.get("score_mismatch"):
        problems.append(f"{out['score_mismatch']} matched detection(s) score differently (beyond {SCORE_ATOL:g})")
    if out.get("unmatched_off_cut"):
        problems.append(f"{out['unmatched_off_cut']} detection(s) without a partner away from any cut")
    allowed = max(1, int(MAX_TIE_SHARE * out.get("matched", 0)))
    out["nms_ties_allowed"] = allowed
    if out.get("nms_ties", 0) > allowed:
        problems.append(f"{out['nms_ties']} of {out['matched']} matched boxes moved beyond {BOX_ATOL_PX:g} px "
                        f"(allowed as NMS ties: {allowed})")
    if maps is not None:
        out["map"] = maps
        out["map_atol"] = MAP_ATOL
        for key in ("map50", "map"):
            a, b = maps["torch"].get(key), maps["onnx"].get(key)
            if a is not None and b is not None and abs(a - b) > MAP_ATOL:
                problems.append(f"{key} {b:.4f} (ONNX) vs {a:.4f} (torch) differs by more than {MAP_ATOL:g}")
    if problems:
        out["ok"] = False
        out["problem"] = "; ".join(problems)
    return out


#: Per-input counts that add up over inputs.
_COUNTS = ("torch_detections", "ort_detections", "matched", "exact", "nms_ties", "score_mismatch", "unmatched",
           "unmatched_off_cut")


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
        elif key in _COUNTS:
            out[key] = sum(values)
        elif key == "argmax_agreement":
            out[key] = min(values)
        else:
            out[key] = values[0]  # tolerances: the same for every input
    return out
