"""An edge consumer of a Musubi deployment manifest: onnxruntime, numpy and Pillow, nothing else.

    python edge_predict.py manifest.json image.jpg [more.jpg ...] [--model NAME] [--conf 0.25] [--json]

Reads manifest.json (what `musubi run` or `musubi registry manifest` writes), picks
the top model (the best leaderboard rank among the promoted ones, or --model),
checks its file's sha256, reads the image as the model's recipe says (resize,
scale, normalisation), runs it with ONNX Runtime (tiling the frame and merging the
tiles' detections when the manifest says the model was trained and measured on
slices) and prints each detection with its class name, in the image's own pixels.
Several images share one check of the file and one ONNX Runtime session (--json: one
line of JSON an image).
Everything it needs is in the manifest: no Musubi, no torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from PIL import Image


class EdgeError(Exception):
    """A problem with the manifest, the model file or the image (printed as one line, exit 2)."""


def pick_model(manifest: dict[str, Any], name: str | None) -> dict[str, Any]:
    """The named model, else the promoted one with the best leaderboard rank (unranked ones last)."""
    models = [m for m in manifest.get("models") or [] if m.get("task") in ("detection", "classification")]
    if name is not None:
        models = [m for m in models if m.get("name") == name]
    if not models:
        raise EdgeError(f"no {'model named ' + repr(name) if name else 'detection or classification model'} "
                        "in the manifest; promote one with `musubi registry promote NAME VERSION`")
    return min(models, key=lambda m: (m.get("rank") is None, m.get("rank") or 0))


def model_file(entry: dict[str, Any], manifest_dir: Path) -> Path:
    """The model's ONNX file (relative to the manifest where it says so), its sha256 checked."""
    item = next((f for f in entry.get("files") or [] if f.get("role") == "model"), None)
    if item is None:
        raise EdgeError(f"{entry.get('name')}: the manifest lists no model file")
    candidates = [manifest_dir / item["relpath"]] if item.get("relpath") else []
    candidates.append(Path(item["path"]))
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise EdgeError(f"{entry.get('name')}: model file not found at {', '.join(map(str, candidates))}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != item.get("sha256"):
        raise EdgeError(f"{path}: sha256 {digest[:16]}... differs from the manifest's {str(item.get('sha256'))[:16]}...;"
                        " the file changed since it was registered: do not deploy it")
    return path


# -- reading the image as the recipe says ----------------------------------------------------------------------
def read_detection_input(path: Path, spec: dict[str, Any]) -> tuple[np.ndarray, int, int]:
    """float32 [C, h, w] model input and the file's own width and height."""
    side = spec.get("resize_longest")
    if spec.get("channels") == 1:
        values = np.asarray(Image.open(path)).astype(np.float32)
        h, w = values.shape[:2]
        if side is not None:  # Pillow's bilinear is close to, not exactly, torch's antialiased one
            scale = side / max(w, h)
            im = Image.fromarray(values, mode="F").resize((max(1, round(w * scale)), max(1, round(h * scale))),
                                                          Image.Resampling.BILINEAR)
            values = np.asarray(im, dtype=np.float32)
        x = (values - np.float32(spec["mean"][0])) / np.float32(spec["std"][0])
        x = x[None]
        return (np.repeat(x, 3, axis=0) if spec.get("replicate") else x), w, h
    im = Image.open(path).convert("RGB")
    w, h = im.size
    if side is not None:  # longest side to the size the job trained at, as its data set read the files
        scale = side / max(w, h)
        im = im.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BILINEAR)
    x = np.asarray(im).transpose(2, 0, 1).astype(np.float32) / np.float32(255.0)
    return x, w, h


def read_classification_input(path: Path, spec: dict[str, Any]) -> np.ndarray:
    """float32 [3, S, S]: shorter side resized, centre crop, [0, 1], (x - mean) / std (torchvision's transforms)."""
    im = Image.open(path).convert("RGB")
    w, h = im.size
    size = spec["resize_shorter"]
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long / short)
    im = im.resize((new_short, new_long) if w <= h else (new_long, new_short), Image.Resampling.BILINEAR)
    crop = spec["center_crop"]
    top, left = int(round((im.height - crop) / 2.0)), int(round((im.width - crop) / 2.0))
    im = im.crop((left, top, left + crop, top + crop))
    x = np.asarray(im).transpose(2, 0, 1).astype(np.float32) / np.float32(255.0)
    mean = np.asarray(spec["mean"], np.float32)[:, None, None]
    std = np.asarray(spec["std"], np.float32)[:, None, None]
    return (x - mean) / std


# -- slicing: the grid and the merge the manifest names ----------------------------------------------------------
def tile_grid(width: int, height: int, tile: int, overlap: float) -> list[tuple[int, int, int, int]]:
    """Windows (x0, y0, x1, y1) covering the frame: stride int(tile * (1 - overlap)), the last one at the border."""
    stride = max(1, int(tile * (1.0 - overlap)))

    def starts(length: int) -> list[int]:
        if length <= tile:
            return [0]
        return [*range(0, length - tile, stride), length - tile]

    return [(x, y, min(x + tile, width), min(y + tile, height)) for y in starts(height) for x in starts(width)]


def greedy_merge(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, threshold: float, metric: str,
                 limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class, best first: a box absorbs every later box overlapping it by `threshold` and grows to their union."""
    order = np.argsort(-scores, kind="stable")[:limit]
    b, s, lab = boxes[order].astype(np.float32), scores[order], labels[order]
    if len(b) == 0:
        return b, s, lab
    x1 = np.maximum(b[:, None, 0], b[None, :, 0])
    y1 = np.maximum(b[:, None, 1], b[None, :, 1])
    x2 = np.minimum(b[:, None, 2], b[None, :, 2])
    y2 = np.minimum(b[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    denom = np.minimum(area[:, None], area[None, :]) if metric == "ios" else area[:, None] + area[None, :] - inter
    match = (inter / np.maximum(denom, np.float32(1e-9)) >= threshold) & (lab[:, None] == lab[None, :])
    taken = np.zeros(len(b), dtype=bool)
    out, keep = b.copy(), []
    for i in range(len(b)):
        if taken[i]:
            continue
        keep.append(i)
        group = match[i] & ~taken & (np.arange(len(b)) > i)
        if group.any():
            members = np.concatenate([b[i:i + 1], b[group]])
            out[i] = np.concatenate([members[:, :2].min(0), members[:, 2:].max(0)])
            taken |= group
    return out[keep], s[keep], lab[keep]


def class_nms(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, iou: float) -> np.ndarray:
    """Indices kept by per-class NMS (a lower box overlapping a kept one by more than `iou` dropped), best first."""
    keep = []
    for c in np.unique(labels):
        idx = np.where(labels == c)[0]
        idx = idx[np.argsort(-scores[idx], kind="stable")]
        while len(idx):
            i, idx = idx[0], idx[1:]
            keep.append(i)
            xx1, yy1 = np.maximum(boxes[i, 0], boxes[idx, 0]), np.maximum(boxes[i, 1], boxes[idx, 1])
            xx2, yy2 = np.minimum(boxes[i, 2], boxes[idx, 2]), np.minimum(boxes[i, 3], boxes[idx, 3])
            inter = np.clip(xx2 - xx1, 0, None) * np.clip(yy2 - yy1, 0, None)
            area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
            idx = idx[inter / (area(boxes[i]) + area(boxes[idx]) - inter) <= iou]
    keep_arr = np.asarray(keep, dtype=np.int64)
    return keep_arr[np.argsort(-scores[keep_arr], kind="stable")] if len(keep_arr) else keep_arr


def detect(session: ort.InferenceSession, x: np.ndarray, rule: dict[str, Any] | None) -> tuple[np.ndarray, ...]:
    """(boxes xyxy, scores, labels) of one model input: one call, or one a tile shifted and merged by `rule`."""
    name = session.get_inputs()[0].name
    if not rule:
        boxes, scores, labels = session.run(None, {name: x[None]})[:3]
        return boxes, scores, labels
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for x0, y0, x1, y1 in tile_grid(x.shape[2], x.shape[1], rule["tile"], rule["overlap"]):
        boxes, scores, labels = session.run(None, {name: np.ascontiguousarray(x[None, :, y0:y1, x0:x1])})[:3]
        parts.append((boxes + np.asarray([x0, y0, x0, y0], boxes.dtype), scores, labels))
    b = np.concatenate([p[0] for p in parts]).reshape(-1, 4)
    s, lab = np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
    top = rule["max_detections"]
    if rule["merge"] == "nmm":
        mb, ms, ml = greedy_merge(b, s, lab, rule["iou"], rule["match_metric"], rule["merge_limit"])
        return mb[:top], ms[:top], ml[:top]
    keep = class_nms(b.astype(np.float32), s, lab, rule["iou"])[:top]
    return b[keep], s[keep], lab[keep]


class Model:
    """The manifest's top (or named) model, its file checked and one ONNX Runtime session made for every image."""

    def __init__(self, manifest_path: Path, name: str | None = None, threads: int | None = None) -> None:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        self.entry = pick_model(manifest, name)
        recipe = self.entry.get("recipe")
        if not isinstance(recipe, dict) or not isinstance(recipe.get("input"), dict):
            raise EdgeError(f"{self.entry.get('name')}: the manifest holds no inference recipe; export and register "
                            "it again")
        self.recipe: dict[str, Any] = recipe
        self.path = model_file(self.entry, manifest_path.parent)
        # a session costs seconds for a detector: made once, not once an image. ONNX Runtime's default thread
        # pool is one spinning thread a core: right on a device that runs nothing else, not beside other work
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(self.path), sess_options=options, providers=["CPUExecutionProvider"])
        self.classes: list[str] = self.entry.get("classes") or recipe.get("classes") or []

    def run(self, image: Path, conf: float | None = None) -> dict[str, Any]:
        """The model on one image: its detections (or class) with names."""
        entry, recipe, session, classes = self.entry, self.recipe, self.session, self.classes
        out: dict[str, Any] = {"model": f"{entry['name']} v{entry['version']}", "file": str(self.path),
                               "image": str(image)}
        if recipe["task"] == "classification":
            logits = session.run(None, {session.get_inputs()[0].name: read_classification_input(
                image, recipe["input"])[None]})[0][0]
            p = np.exp(logits - logits.max())
            p /= p.sum()
            k = int(p.argmax())
            out["class"] = {"label": k, "name": classes[k] if k < len(classes) else str(k), "score": float(p[k])}
            return out
        x, w, h = read_detection_input(image, recipe["input"])
        boxes, scores, labels = detect(session, x, recipe.get("slice"))
        sx, sy = w / x.shape[2], h / x.shape[1]  # model-input pixels -> the image's own
        found = []
        for box, score, label in zip(boxes.tolist(), scores.tolist(), labels.tolist(), strict=True):
            if (conf is not None and score < conf) or not 1 <= label <= len(classes):
                continue
            found.append({"name": classes[label - 1], "label": int(label), "score": float(score),
                          "box": [box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy]})
        out["detections"] = found
        return out


def show(result: dict[str, Any]) -> None:
    """Print one image's result as lines: the model and image, then each detection (or the class)."""
    print(f"{result['model']} on {result['image']}")
    if "class" in result:
        print(f"{result['class']['name']} {result['class']['score']:.3f}")
        return
    for d in result["detections"]:
        x1, y1, x2, y2 = d["box"]
        print(f"{d['name']:<16} {d['score']:.3f}  [{x1:.1f}, {y1:.1f}, {x2:.1f}, {y2:.1f}]")
    print(f"{len(result['detections'])} detection(s)")


def main(argv: list[str] | None = None) -> int:
    """Command line: print the named detections (or --json, one line an image)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("image", type=Path, nargs="+", help="one or more images, run by one session in turn")
    parser.add_argument("--model", help="a model name of the manifest (default: the best ranked)")
    parser.add_argument("--conf", type=float, help="keep detections scoring at least this")
    parser.add_argument("--json", action="store_true", help="print each image's result as one line of JSON")
    parser.add_argument("--threads", type=int, help="ONNX Runtime's intra-op threads (default: one a core; set it "
                        "where the device runs other work beside the model)")
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads {args.threads}: give 1 or more (or leave it out: one a core)")
    try:
        model = Model(args.manifest, args.model, args.threads)
        for image in args.image:
            result = model.run(image, args.conf)
            if args.json:
                print(json.dumps(result))
            else:
                show(result)
    except (EdgeError, OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
