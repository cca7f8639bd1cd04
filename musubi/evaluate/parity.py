"""ONNX Runtime against torch on the same inputs: element-wise for tensors, detection by detection for detectors.

A detector's outputs pass through decisions (a score threshold, NMS, a top-k cut) that turn a float
difference of 1e-7 into a whole detection kept on one side and dropped on the other when two candidates
sit at a decision boundary. Such a difference is explained, recorded and tolerated; only a difference no
decision boundary explains is a real disagreement (see `compare_detections`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Element-wise tolerance of an output tensor: |ort - torch| <= ATOL + RTOL * |torch| (fp32 kernels differ).
#: Classification logits and other dense outputs pass no decision, so nothing else is tolerated there.
RTOL, ATOL = 1e-3, 1e-3
#: The same detection on both sides: box corners within BOX_ATOL_PX pixels, scores within SCORE_ATOL, labels equal.
BOX_ATOL_PX, SCORE_ATOL = 0.5, 1e-3
#: Two detections may be the same object when their boxes overlap at least this much (IoU).
MATCH_IOU = 0.5
#: Two candidates' scores tie when they are closer than TIE_FACTOR x the runtimes' own score difference (the
#: largest over the input's exact pairs), at least TIE_MIN (4 fp32 steps near 0.5), at most SCORE_ATOL.
TIE_FACTOR, TIE_MIN = 4.0, 2.5e-7
#: A box sits at an NMS decision when its IoU with the suppressing box is within IOU_ATOL of the NMS threshold
#: (boxes agree to ~1e-4 px between the runtimes: 1e-3 of IoU covers boxes down to a few pixels).
IOU_ATOL = 1e-3
#: Tied candidates kept differently (`nms_tie` pairs, `order_tie` pairs) are rare: tolerated for up to this
#: share of the matched detections (at least one). A graph that moves boxes at equal scores moves nearly all.
MAX_TIE_SHARE = 0.1
#: An R-CNN's proposals may differ at the RPN's decisions for up to this share of them: an untrained RPN
#: ties often (measured: up to 14 of 150), a graph that computes other proposals moves nearly all of them.
MAX_PROPOSAL_SHARE = 0.25
#: mAP50 and mAP50-95 of the ONNX predictions on the parity samples within this of torch's.
MAP_ATOL = 0.01
#: Explained differences listed in export.json (all are counted); every real disagreement is listed.
MAX_LISTED = 200

#: Kinds of explained differences (tolerated) and of real disagreements (refused), as export.json counts them.
EXPLAINED = ("nms_tie", "order_tie", "score_threshold", "top_k", "nms_iou_edge", "nms_chain", "proposals")
REAL = ("score_changed", "box_moved", "class_changed", "unpaired")


@dataclass(frozen=True)
class Cuts:
    """The decisions a detector makes after its dense outputs: a score threshold, NMS, a top-k cut."""

    #: Candidates scoring above this are kept (0: no threshold).
    score_threshold: float = 0.0
    #: The most detections an input keeps (None: no cut known).
    top_k: int | None = None
    #: NMS IoU threshold (None: no NMS, e.g. DETR's top-k of queries).
    nms_iou: float | None = None
    #: NMS per class (torchvision's batched_nms by label) or over all boxes.
    class_aware: bool = True


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


def box_iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one xyxy box [4] with boxes [N,4], in float64."""
    box, boxes = np.asarray(box, np.float64), np.asarray(boxes, np.float64).reshape(-1, 4)
    lt = np.maximum(box[:2], boxes[:, :2])
    rb = np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
    area = np.prod(box[2:] - box[:2])
    areas = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
    return inter / np.maximum(area + areas - inter, 1e-9)


def _match(rb: np.ndarray, rs: np.ndarray, rl: np.ndarray, gb: np.ndarray, gs: np.ndarray,
           gl: np.ndarray) -> list[tuple[int, int]]:
    """Pairs (torch index, ORT index), torch's highest score first: first every exact partner (same label, box
    within BOX_ATOL_PX, score within SCORE_ATOL, the closest box), then among the rest the same label at
    IoU >= MATCH_IOU with the closest score (a swapped near-duplicate pairs with its twin)."""
    used = np.zeros(len(gs), dtype=bool)
    taken = np.zeros(len(rs), dtype=bool)
    pairs = []
    order = np.argsort(-rs, kind="stable")
    for i in order:
        cand = np.flatnonzero((gl == rl[i]) & ~used & (np.abs(gs - rs[i]) <= SCORE_ATOL))
        if cand.size:
            d = np.abs(gb[cand] - rb[i]).max(axis=1)
            if d.min() <= BOX_ATOL_PX:
                j = cand[int(d.argmin())]
                used[j] = taken[i] = True
                pairs.append((int(i), int(j)))
    for i in order[~taken[order]]:
        cand = np.flatnonzero((gl == rl[i]) & ~used)
        if not cand.size:
            continue
        close = box_iou(rb[i], gb[cand]) >= MATCH_IOU
        if close.any():
            j = cand[int(np.where(close, -np.abs(gs[cand] - rs[i]), -np.inf).argmax())]
            used[j] = True
            pairs.append((int(i), int(j)))
    return pairs


def _record(kind: str, side: str, box: np.ndarray, score: float, label: int, why: str) -> dict[str, Any]:
    return {"kind": kind, "real": kind in REAL, "side": side, "label": int(label), "score": round(float(score), 7),
            "box": [round(float(v), 3) for v in box], "why": why}


def compare_detections(ref: tuple[np.ndarray, ...], got: tuple[np.ndarray, ...],
                       cuts: Cuts | None = None) -> dict[str, Any]:
    """Pair ORT detections with torch's on one input and explain every difference by a decision boundary.

    Exact: a partner within BOX_ATOL_PX and SCORE_ATOL. Explained (tolerated), each with why:
    `nms_tie` a pair of near-duplicates with tied scores whose boxes differ (NMS kept the other twin);
    a detection on one side only that is `order_tie` (the other side kept another candidate of a tied score),
    at the `score_threshold` (its score ties the threshold), at the `top_k` cut (the other side is full and
    ranks it at or below its last), at an `nms_iou_edge` (the other side holds a same-class box scoring at
    least as high whose IoU with it ties the NMS threshold) or an `nms_chain` (suppressed on the other side by
    a box that side alone holds, itself explained). Anything else is real: `score_changed`, `box_moved`,
    `class_changed` or `unpaired`. `ok` is False when a real disagreement remains.
    """
    cuts = cuts or Cuts()
    rb, rs, rl = (np.asarray(x) for x in ref)
    gb, gs, gl = (np.asarray(x) for x in got)
    rb, gb = rb.reshape(-1, 4).astype(np.float64), gb.reshape(-1, 4).astype(np.float64)
    rs, gs = rs.astype(np.float64), gs.astype(np.float64)
    pairs = _match(rb, rs, rl, gb, gs, gl)
    box_d = {p: float(np.abs(rb[p[0]] - gb[p[1]]).max()) for p in pairs}
    score_d = {p: float(abs(rs[p[0]] - gs[p[1]])) for p in pairs}
    exact = [p for p in pairs if box_d[p] <= BOX_ATOL_PX and score_d[p] <= SCORE_ATOL]
    noise = max((score_d[p] for p in exact), default=0.0)
    tie = float(np.clip(TIE_FACTOR * noise, TIE_MIN, SCORE_ATOL))
    records: list[dict[str, Any]] = []
    ties = [p for p in pairs if p not in exact and score_d[p] <= tie]
    for i, j in ties:
        rec = _record("nms_tie", "both", rb[i], rs[i], rl[i],
                      f"tied scores ({score_d[(i, j)]:.2g} apart), boxes {box_d[(i, j)]:.3g} px apart at IoU "
                      f"{box_iou(rb[i], gb[j])[0]:.3f}: each runtime kept another of two tied candidates (NMS or top-k order)")
        records.append(rec | {"onnx_box": [round(float(v), 3) for v in gb[j]], "onnx_score": round(float(gs[j]), 7)})
    # Everything not exact and not a tied pair stands alone on its side: ("torch"|"onnx", index).
    split = {p for p in pairs if p not in exact and p not in ties}
    paired_r = {i for (i, _) in pairs if (i, _) not in split}
    paired_g = {j for (_, j) in pairs if (_, j) not in split}
    alone = [("torch", i) for i in range(len(rs)) if i not in paired_r]
    alone += [("onnx", j) for j in range(len(gs)) if j not in paired_g]
    sides = {"torch": (rb, rs, rl), "onnx": (gb, gs, gl)}
    kind: dict[tuple[str, int], str] = {}
    why: dict[tuple[str, int], str] = {}
    other = {"torch": "onnx", "onnx": "torch"}
    names = {"torch": "torch", "onnx": "ONNX Runtime"}

    def same_class(side: str, k: int) -> np.ndarray:
        labels = sides[other[side]][2]
        return labels == sides[side][2][k] if cuts.class_aware else np.ones(len(labels), dtype=bool)

    for side, k in alone:  # decisions a detection meets alone: threshold, top-k, a tied candidate
        b, s, lab = (a[k] for a in sides[side])
        ob, os_, ol = sides[other[side]]
        if cuts.score_threshold > 0 and abs(s - cuts.score_threshold) <= tie:
            kind[side, k] = "score_threshold"
            why[side, k] = f"its score ties the score threshold {cuts.score_threshold:g}"
        elif cuts.top_k is not None and len(os_) >= cuts.top_k and s <= os_.min() + tie:
            kind[side, k] = "top_k"
            why[side, k] = (f"{names[other[side]]} is full ({cuts.top_k}) and its last kept score "
                            f"{os_.min():.6g} ranks this one out")
        else:
            twins = [j for (o, j) in alone if o == other[side] and ol[j] == lab and abs(os_[j] - s) <= tie]
            if twins:
                kind[side, k] = "order_tie"
                why[side, k] = (f"{names[other[side]]} kept another candidate of the same class at a tied score "
                                f"({os_[twins[0]]:.7g}): a top-k or NMS order tie")
    for side, k in alone:  # NMS at the IoU edge: the suppressing box is on both sides
        if (side, k) in kind or cuts.nms_iou is None:
            continue
        b, s = sides[side][0][k], sides[side][1][k]
        ob, os_ = sides[other[side]][:2]
        ious = box_iou(b, ob)
        edge = same_class(side, k) & (os_ >= s - tie) & (np.abs(ious - cuts.nms_iou) <= IOU_ATOL)
        if edge.any():
            j = int(np.flatnonzero(edge)[0])
            kind[side, k] = "nms_iou_edge"
            why[side, k] = (f"{names[other[side]]}'s box scoring {os_[j]:.6g} overlaps it at IoU {ious[j]:.5f}, "
                            f"a tie with the NMS threshold {cuts.nms_iou:g}")
    changed = cuts.nms_iou is not None
    while changed:  # NMS chains: suppressed on the other side by a box only that side holds (explained)
        changed = False
        for side, k in alone:
            if (side, k) in kind:
                continue
            b, s = sides[side][0][k], sides[side][1][k]
            ob, os_ = sides[other[side]][:2]
            alone_there = np.zeros(len(os_), dtype=bool)
            for o, j in alone:
                if o == other[side] and (o, j) in kind:
                    alone_there[j] = True
            for p in ties:  # the other side's twin of a tied pair is a box only it holds
                alone_there[p[0] if side == "onnx" else p[1]] = True
            ious = box_iou(b, ob)
            chain = same_class(side, k) & alone_there & (os_ >= s - tie) & (ious > cuts.nms_iou - IOU_ATOL)
            if chain.any():
                j = int(np.flatnonzero(chain)[0])
                kind[side, k] = "nms_chain"
                why[side, k] = (f"suppressed in {names[other[side]]} by its box scoring {os_[j]:.6g} (IoU "
                                f"{ious[j]:.3f}), which only {names[other[side]]} holds, itself explained")
                changed = True
    reported: set[tuple[str, int]] = set()
    for i, j in sorted(split):  # a pair whose two sides are both unexplained: one disagreement, not two
        if ("torch", i) in kind or ("onnx", j) in kind:
            continue
        moved = box_d[(i, j)] > BOX_ATOL_PX
        rec = _record("box_moved" if moved else "score_changed", "both", rb[i], rs[i], rl[i],
                      f"box {box_d[(i, j)]:.3g} px and score {score_d[(i, j)]:.3g} apart (beyond {BOX_ATOL_PX:g} px "
                      f"or {SCORE_ATOL:g}), at no threshold, cut or NMS tie")
        records.append(rec | {"onnx_box": [round(float(v), 3) for v in gb[j]], "onnx_score": round(float(gs[j]), 7)})
        reported |= {("torch", i), ("onnx", j)}
    for side, k in alone:
        b, s, lab = (a[k] for a in sides[side])
        if (side, k) in kind:
            records.append(_record(kind[side, k], side, b, s, lab, why[side, k]))
            continue
        if (side, k) in reported:
            continue
        ob, os_, ol = sides[other[side]]
        ious = box_iou(b, ob)
        unexplained = np.zeros(len(os_), dtype=bool)
        for o, j in alone:
            if o == other[side] and (o, j) not in kind and (o, j) not in reported:
                unexplained[j] = True
        relabel = np.flatnonzero(unexplained & (ol != lab) & (ious >= MATCH_IOU) & (np.abs(os_ - s) <= SCORE_ATOL))
        if relabel.size and side == "torch":
            j = int(relabel[ious[relabel].argmax()])
            records.append(_record("class_changed", "both", b, s, lab,
                                   f"the same box (IoU {ious[j]:.3f}) is class {int(ol[j])} in ONNX Runtime")
                           | {"onnx_label": int(ol[j]), "onnx_score": round(float(os_[j]), 7),
                              "onnx_box": [round(float(v), 3) for v in ob[j]]})
            reported.add(("onnx", j))
            continue
        last = f"{os_.min():.6g}" if len(os_) else "none"
        records.append(_record("unpaired", side, b, s, lab, (
            f"only {names[side]} has it: its score is not at the threshold {cuts.score_threshold:g}, ranks above "
            f"{names[other[side]]}'s last kept score ({last}, {len(os_)} kept), and no {names[other[side]]} box "
            f"scoring as high ties the NMS IoU threshold or holds a tied score")))
    counts = {k: sum(r["kind"] == k for r in records) for k in EXPLAINED + REAL}
    return {
        "torch_detections": len(rs),
        "ort_detections": len(gs),
        "matched": len(exact) + len(ties),
        "exact": len(exact),
        "nms_ties": len(ties),
        "score_mismatch": counts["score_changed"],
        "unmatched": len(alone),
        "kinds": {k: v for k, v in counts.items() if v},
        "max_box_diff_px": max((box_d[p] for p in exact), default=0.0),
        "max_score_diff": noise,
        "tie_atol": tie,
        "box_atol_px": BOX_ATOL_PX,
        "score_atol": SCORE_ATOL,
        "iou_atol": IOU_ATOL,
        "differences": records,
        "ok": not any(r["real"] for r in records),
    }


def explain_by_proposals(result: dict[str, Any], proposals: dict[str, Any], replay: dict[str, Any],
                         same_graph: bool) -> dict[str, Any]:
    """A two-stage detector's real disagreements on one input, explained upstream when (1) the graph that also
    returns the proposals gives the shipped graph's detections (`same_graph`), (2) the proposals differ only
    at the RPN's own decisions (`proposals`: `compare_detections` of torch's and ORT's proposals), and (3)
    torch's box head on ORT's proposals gives ORT's detections (`replay`): then each is kind `proposals`."""
    out = dict(result)
    out["proposals"] = {"kinds": proposals.get("kinds", {}), "exact": proposals.get("exact"),
                        "proposals": proposals.get("torch_detections"), "replay_exact": replay.get("exact"),
                        "replay_kinds": replay.get("kinds", {}), "same_graph": same_graph}
    moved = sum(proposals.get("kinds", {}).values())
    if not (same_graph and proposals["ok"] and replay["ok"]) or moved > MAX_PROPOSAL_SHARE * proposals["torch_detections"]:
        return out
    why = (f"the RPN kept other proposals at its own near-ties ({moved} proposal difference(s): "
           + ", ".join(f"{v} {k}" for k, v in proposals["kinds"].items())
           + f"); torch's box head on ONNX Runtime's proposals gives ONNX Runtime's detections "
           f"({replay['exact']} exact of {replay['ort_detections']})")
    records = [r | {"kind": "proposals", "real": False, "why": f"{why}; at the output: {r['why']}"} if r["real"] else r
               for r in out["differences"]]
    out["differences"] = records
    out["kinds"] = {k: sum(r["kind"] == k for r in records) for k in EXPLAINED + REAL}
    out["kinds"] = {k: v for k, v in out["kinds"].items() if v}
    out["score_mismatch"] = out["kinds"].get("score_changed", 0)
    out["ok"] = True
    return out


def _label_text(label: int, names: list[str] | None) -> str:
    if names and 1 <= label <= len(names):
        return f"class {label} {names[label - 1]!r}"
    return f"class {label}"


def describe(record: dict[str, Any], names: list[str] | None = None) -> str:
    """One disagreement in a few words: image, class, score, box, which side, why."""
    where = {"torch": "only in torch", "onnx": "only in ONNX Runtime", "both": "torch"}[record["side"]]
    image = f"image {record['image']}" + (f" (image_id {record['image_id']})" if "image_id" in record else "")
    text = f"{image} {_label_text(record['label'], names)} score {record['score']:.4g} box {record['box']} ({where}"
    if record["side"] == "both" and "onnx_box" in record:
        onnx_label = record.get("onnx_label", record["label"])
        text += (f"; ONNX Runtime {_label_text(onnx_label, names)} score {record['onnx_score']:.4g} "
                 f"box {record['onnx_box']}")
    return f"{text}): {record['kind']}"


def judge_detections(results: list[dict[str, Any]], maps: dict[str, dict[str, float]] | None,
                     names: list[str] | None = None, images: list[Any] | None = None) -> dict[str, Any]:
    """Detection parity over the samples: no real disagreement on any input, NMS ties within MAX_TIE_SHARE of
    the matched detections, and (with ground truth) mAP of the ONNX predictions within MAP_ATOL of torch's.

    `maps`: {"torch": {"map50": .., "map": ..}, "onnx": {...}} on the same samples, or None. `names`: class
    names (label L is names[L - 1]); `images`: each input's image_id, when known (inputs are numbered from 0).
    Every difference is counted per kind; the explained ones are listed (up to MAX_LISTED), the real ones all.
    """
    out = merge(results)
    kinds: dict[str, int] = {}
    listed: list[dict[str, Any]] = []
    real: list[dict[str, Any]] = []
    for n, r in enumerate(results):
        for k, v in r.get("kinds", {}).items():
            kinds[k] = kinds.get(k, 0) + v
        for rec in r.get("differences", []):
            rec = {"image": n} | ({"image_id": images[n]} if images else {}) | rec
            if names and 1 <= rec["label"] <= len(names):
                rec["name"] = names[rec["label"] - 1]
            (real if rec["real"] else listed).append(rec)
    out.pop("differences", None)
    out["kinds"] = kinds
    out["explained"] = sum(v for k, v in kinds.items() if k in EXPLAINED)
    out["differences"] = listed[:MAX_LISTED]
    out["tie_atol"] = max((r.get("tie_atol", 0.0) for r in results), default=0.0)
    proposals = [{"image": n} | ({"image_id": images[n]} if images else {}) | r["proposals"]
                 for n, r in enumerate(results) if "proposals" in r]
    if proposals:
        out["proposals"] = proposals
    problems = []
    if real:
        out["disagreements"] = real
        shown = "; ".join(describe(r, names) for r in real[:3])
        more = f"; and {len(real) - 3} more" if len(real) > 3 else ""
        problems.append(f"{len(real)} real disagreement(s) that no score threshold, top-k cut or NMS near-tie "
                        f"explains: {shown}{more}")
        if kinds.get("score_changed"):
            problems.append(f"{kinds['score_changed']} matched detection(s) score differently (beyond {SCORE_ATOL:g})")
    allowed = max(1, int(MAX_TIE_SHARE * out.get("matched", 0)))
    out["nms_ties_allowed"] = allowed
    tied = out.get("nms_ties", 0) + (kinds.get("order_tie", 0) + 1) // 2  # an order tie is two records
    if tied > allowed:
        problems.append(f"{tied} of {out['matched']} matched detections kept another box at a tied score "
                        f"(boxes moved beyond {BOX_ATOL_PX:g} px), more than ties explain (allowed: {allowed})")
    if maps is not None:
        out["map"] = maps
        out["map_atol"] = MAP_ATOL
        for key in ("map50", "map"):
            a, b = maps["torch"].get(key), maps["onnx"].get(key)
            if a is not None and b is not None and abs(a - b) > MAP_ATOL:
                problems.append(f"{key} {b:.4f} (ONNX) vs {a:.4f} (torch) differs by more than {MAP_ATOL:g}")
    out["ok"] = not problems
    out.pop("problem", None)
    if problems:
        out["problem"] = "; ".join(problems)
    return out


#: Per-input counts that add up over inputs.
_COUNTS = ("torch_detections", "ort_detections", "matched", "exact", "nms_ties", "score_mismatch", "unmatched")


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
        if key in ("ok", "problem", "kinds", "differences", "proposals") or not values:
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
