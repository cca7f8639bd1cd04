"""The quality bench's data: real handwritten digits written as PNG files that both training loops read.

Source: the UCI "Optical Recognition of Handwritten Digits" data set (E. Alpaydin, C. Kaynak, 1998;
https://archive.ics.uci.edu/dataset/80, DOI 10.24432/C50P49), licensed CC BY 4.0 by the UCI repository. The
copy read here is its test part, 1797 digits of 8x8 pixels (0..16) written by 13 people, bundled with
scikit-learn as sklearn/datasets/data/digits.csv.gz (scikit-learn itself is BSD-3-Clause) and read with
`sklearn.datasets.load_digits()`: offline, on this machine and on the lent GPU machine alike.

Two sets are written from it, split by digit (stratified, 20 % for validation, the same split for both):

- `cls/`: an image folder (one folder per digit), each digit upscaled to SIDE px (bilinear), greyscale PNG.
- `det/`: detection scenes COMPOSED from those real digits (the scenes are made here, the digits are not):
  8-16 digits per 256 x 256 black canvas, each upscaled to 24-56 px, never overlapping, boxes the exact
  extent of each digit's ink (every pixel > 0 of the pasted patch; faint interpolation halo below INK is set
  to 0 first). Train scenes use train digits, validation scenes validation digits. COCO JSON, category id =
  digit + 1 (named "0".."9"). Many digits a scene, because a detector's step costs mostly per image
  (torchvision's R-CNN samples anchors and RoIs image by image; a DETR matches image by image): 12 digits an
  image teach more a second than 3.5 (the 160 px, 2-5 digit scenes of session 19) at about the same cost.

numpy and PIL only (no torch, no musubi): `python bench/quality_data.py DIR` writes the sets alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

SOURCE = ("UCI Optical Recognition of Handwritten Digits (Alpaydin & Kaynak 1998), test part (1797 digits, 8x8, "
          "13 writers), as bundled with scikit-learn (sklearn.datasets.load_digits)")
LICENCE = "CC BY 4.0 (UCI Machine Learning Repository, DOI 10.24432/C50P49); scikit-learn's copy: BSD-3-Clause package"
#: Digits in scikit-learn's copy.
DIGITS = 1797
#: Pixels of the upscaled digit below this are background (bilinear interpolation leaves a faint halo).
INK = 16


@dataclass(frozen=True)
class DataParams:
    """What decides the written sets; a folder written with other parameters is rewritten."""

    seed: int = 0
    val_fraction: float = 0.2
    side: int = 32  # classification image side (px)
    canvas: int = 256  # detection scene side (px; a multiple of 32, a DETR's coarsest stride)
    min_digit: int = 24  # detection: side of an upscaled digit before its ink is cropped (px)
    max_digit: int = 56
    min_objects: int = 8  # digits a scene (fewer when no free spot is found: 11.7 on average at these sizes)
    max_objects: int = 16
    train_scenes: int = 800
    val_scenes: int = 120


def load_digits_uint8() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [1797, 8, 8] scaled 0..16 -> 0..255, labels int64 [1797]) from scikit-learn's bundled copy."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("bench/quality_data.py: needs scikit-learn (its bundled digits): pip install scikit-learn"
                         ) from None
    d = load_digits()
    return np.rint(d.images * (255.0 / 16.0)).astype(np.uint8), d.target.astype(np.int64)


def stratified_split(labels: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, val indices), sorted: round(val_fraction x n_c) of each class c to validation."""
    rng = np.random.default_rng(seed)
    val: list[int] = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        val += rng.permutation(members)[: round(val_fraction * len(members))].tolist()
    val_idx = np.array(sorted(val), dtype=np.int64)
    train_idx = np.setdiff1d(np.arange(len(labels)), val_idx)
    return train_idx, val_idx


def upscale(image: np.ndarray, side: int) -> np.ndarray:
    """uint8 [8, 8] -> uint8 [side, side], bilinear (PIL)."""
    return np.asarray(Image.fromarray(image).resize((side, side), Image.Resampling.BILINEAR))


def ink_patch(image: np.ndarray, side: int) -> np.ndarray:
    """The digit upscaled to `side`, halo below INK zeroed, cropped to the rows and columns holding ink."""
    big = upscale(image, side).copy()
    big[big < INK] = 0
    rows, cols = np.flatnonzero(big.any(1)), np.flatnonzero(big.any(0))
    return big[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]


def compose_scene(rng: np.random.Generator, images: np.ndarray, labels: np.ndarray, p: DataParams
                  ) -> tuple[np.ndarray, list[tuple[int, int, int, int, int]]]:
    """A black canvas [canvas, canvas] uint8 holding min..max_objects digits drawn from `images`, and per digit
    (x, y, w, h, digit): its ink's exact extent. Boxes never overlap (a 2-px gap), so each box's crop is
    its digit's patch alone."""
    canvas = np.zeros((p.canvas, p.canvas), dtype=np.uint8)
    placed: list[tuple[int, int, int, int, int]] = []
    for _ in range(int(rng.integers(p.min_objects, p.max_objects + 1))):
        k = int(rng.integers(len(images)))
        patch = ink_patch(images[k], int(rng.integers(p.min_digit, p.max_digit + 1)))
        h, w = patch.shape
        for _try in range(50):  # a free spot, else this digit is left out
            x, y = int(rng.integers(0, p.canvas - w + 1)), int(rng.integers(0, p.canvas - h + 1))
            if all(x + w + 2 <= bx or bx + bw + 2 <= x or y + h + 2 <= by or by + bh + 2 <= y
                   for bx, by, bw, bh, _ in placed):
                canvas[y : y + h, x : x + w] = patch
                placed.append((x, y, w, h, int(labels[k])))
                break
    return canvas, placed


def write_classification(root: Path, images: np.ndarray, labels: np.ndarray, split: dict[str, np.ndarray],
                         side: int) -> dict[str, int]:
    """root/{train,val}/<digit>/<index>.png; returns the image count per split."""
    counts = {}
    for name, idx in split.items():
        for i in idx.tolist():
            folder = root / name / str(int(labels[i]))
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(upscale(images[i], side)).save(folder / f"{i:04d}.png")
        counts[name] = len(idx)
    return counts


def coco_scenes(folder: Path, images: np.ndarray, labels: np.ndarray, n: int, seed: int, p: DataParams
                ) -> dict[str, int]:
    """`n` scenes as folder/images/<id>.png and folder/annotations.json (COCO); returns the counts."""
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    coco: dict[str, list] = {"images": [], "annotations": [],
                             "categories": [{"id": d + 1, "name": str(d)} for d in range(10)]}
    for image_id in range(1, n + 1):
        canvas, boxes = compose_scene(rng, images, labels, p)
        name = f"{image_id:05d}.png"
        Image.fromarray(canvas).save(folder / "images" / name)
        coco["images"].append({"id": image_id, "file_name": name, "width": p.canvas, "height": p.canvas})
        for x, y, w, h, digit in boxes:
            coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": image_id,
                                        "category_id": digit + 1, "bbox": [x, y, w, h], "area": w * h,
                                        "iscrowd": 0})
    (folder / "annotations.json").write_text(json.dumps(coco))
    return {"images": n, "boxes": len(coco["annotations"])}


def write_sets(root: Path, p: DataParams = DataParams()) -> dict:
    """Write cls/ and det/ under `root` (skipped when root/DATA.json records the same parameters); the record."""
    record_path = root / "DATA.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record.get("params") == asdict(p):
            return record
    for stale in (root / "cls", root / "det", record_path):  # written with other parameters: no leftovers
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    images, labels = load_digits_uint8()
    train_idx, val_idx = stratified_split(labels, p.val_fraction, p.seed)
    split = {"train": train_idx, "val": val_idx}
    record = {
        "source": SOURCE, "licence": LICENCE, "params": asdict(p),
        "classification": write_classification(root / "cls", images, labels, split, p.side),
        "detection": {name: coco_scenes(root / "det" / name, images[idx], labels[idx], n, p.seed * 2 + k, p)
                      for k, (name, idx, n) in enumerate((("train", train_idx, p.train_scenes),
                                                          ("val", val_idx, p.val_scenes)))},
    }
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def main() -> None:
    """`python bench/quality_data.py DIR`: write the sets, print their record."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    print(json.dumps(write_sets(ap.parse_args().root), indent=1))


if __name__ == "__main__":
    main()
