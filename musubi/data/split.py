"""`musubi data split`: cut one COCO set into train/val(/test) by group, so no group lands on two sides.

A group is what must stay on one side: by default the source frame (the tiles of one
frame cut by `musubi data slice`; any other image is its own frame), or the folder of
the file name (`folder`: one sequence or site per folder), or any image field
(`sequence`, `site`, `video_id`, ...). On top of the key, images that are tiles of one
frame, byte-identical or near-identical (musubi.data.leakage) are always joined into
one group, so the splits written pass the leakage check of `musubi data check`; the
result is checked again before anything is written. Groups are shuffled with the
seed and each goes to the split furthest below its share of images.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.data.coco import CocoDetection, read_annotation_json
from musubi.data.leakage import find_leaks, identical_pairs, near_pairs, split_images, thumbnails


@dataclass
class SplitReport:
    """What `split_coco` wrote: per split its file, images, boxes and groups; groups joined by content."""

    by: str
    seed: int
    groups: int
    joined_by_content: int
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)


class _Groups:
    """Union-find over image indices."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def join(self, i: int, j: int) -> bool:
        a, b = self.find(i), self.find(j)
        if a == b:
            return False
        self.parent[max(a, b)] = min(a, b)
        return True


def parse_ratios(ratios: str, names: str | None) -> dict[str, float]:
    """'0.8,0.2' (+ 'train,val') -> {"train": 0.8, "val": 0.2}; ConfigError naming the problem."""
    try:
        values = [float(v) for v in ratios.split(",")]
    except ValueError:
        raise ConfigError(f"--ratios {ratios!r}: give fractions like 0.8,0.2 or 0.7,0.15,0.15") from None
    if len(values) < 2 or any(not 0.0 < v < 1.0 for v in values) or abs(sum(values) - 1.0) > 1e-6:
        raise ConfigError(f"--ratios {ratios!r}: give two or more fractions in (0, 1) that sum to 1")
    if names is None:
        if len(values) > 3:
            raise ConfigError(f"--ratios gives {len(values)} splits; name them with --names a,b,c,...")
        labels = ["train", "val", "test"][: len(values)]
    else:
        labels = [n.strip() for n in names.split(",")]
    if len(labels) != len(values) or len(set(labels)) != len(labels) or not all(
            n and n.replace("_", "").replace("-", "").isalnum() for n in labels):
        raise ConfigError(f"--names {names!r}: give {len(values)} distinct names of letters, digits, '-' or '_'")
    return dict(zip(labels, values, strict=True))


def _key_of(entry: dict[str, Any], by: str, ann: Path) -> str:
    if by == "frame":
        return f"id:{entry['id']}"  # each image alone; tiles are joined by their frame below
    if by == "folder":
        return "dir:" + str(PurePosixPath(entry["file_name"]).parent)
    if entry.get(by) is None or isinstance(entry.get(by), (dict, list)):
        raise ConfigError(f"{ann}: image {entry.get('id')} ({entry.get('file_name')}) has no {by!r} value; add it "
                          "to every image entry, or split --by frame or --by folder")
    return f"{by}:{entry[by]}"


def assign(sizes: list[int], ratios: dict[str, float], seed: int) -> list[str]:
    """The split of each group: groups shuffled with `seed`, each to the split furthest below its share."""
    order = list(range(len(sizes)))
    random.Random(seed).shuffle(order)
    total = sum(sizes)
    count = dict.fromkeys(ratios, 0)
    out = [""] * len(sizes)
    for g in order:
        name = max(ratios, key=lambda n: ratios[n] * total - count[n])  # first name wins a tie
        out[g] = name
        count[name] += sizes[g]
    return out


def split_coco(ann: Path, image_dir: Path, out: Path, ratios: dict[str, float], by: str = "frame",
               seed: int = 0) -> SplitReport:
    """Write OUT/<name>.json per split (COCO, ids and entries unchanged) and return what went where."""
    CocoDetection(image_dir, ann)  # the reader's own checks: a set training would refuse is refused here
    raw = read_annotation_json(ann)
    entries: list[dict[str, Any]] = raw["images"]
    if len(entries) < len(ratios):
        raise ConfigError(f"{ann}: {len(entries)} images cannot fill {len(ratios)} splits; give fewer --ratios")
    found = split_images("all", raw, image_dir)
    assert len(found) == len(entries)  # CocoDetection checked every file exists
    groups = _Groups(len(entries))
    first_of: dict[str, int] = {}
    for i, entry in enumerate(entries):
        for key in (_key_of(entry, by, ann), found[i].frame):
            if key is not None:
                groups.join(i, first_of.setdefault(key, i))
    before = len({groups.find(i) for i in range(len(entries))})
    # Copies and near-copies of a picture are one group whatever their key says.
    for i, j in identical_pairs(found):
        groups.join(i, j)
    thumbs = thumbnails([im.path for im in found])
    for i, j, _ in near_pairs(thumbs):
        groups.join(i, j)
    roots = sorted({groups.find(i) for i in range(len(entries))})
    frames = len({im.frame if im.frame is not None else f"#{i}" for i, im in enumerate(found)})
    if len(roots) < len(ratios):
        # A finer --by helps only when the key, not the frames, made the groups this few.
        fix = (f"the images are tiles of {frames} source frame(s), which never straddle splits whatever --by says: "
               "add frames, or split the frames before `musubi data slice`" if frames < len(ratios) else
               "split --by a finer key")
        raise ConfigError(f"{ann}: only {len(roots)} groups by {by} (tiles of one frame and copies joined); "
                          f"{len(ratios)} splits need at least as many: {fix}")
    index = {r: n for n, r in enumerate(roots)}
    group_of = [index[groups.find(i)] for i in range(len(entries))]
    sizes = [0] * len(roots)
    for g in group_of:
        sizes[g] += 1
    side = assign(sizes, ratios, seed)
    where = [side[g] for g in group_of]
    empty = [n for n in ratios if n not in where]
    if empty:
        finer = "" if frames <= len(roots) else " or split --by a finer key"  # frames, not the key, made them
        raise ConfigError(f"{ann}: split {empty[0]!r} got no image ({len(roots)} groups by {by}, the largest "
                          f"{max(sizes)} images); raise its ratio{finer}")
    leaks = find_leaks([replace(im, split=s) for im, s in zip(found, where, strict=True)], thumbs=thumbs)
    if leaks.count:  # joined above, so this is a guard against a broken rule, never a normal outcome
        first = (leaks.same_frame + leaks.identical + leaks.near_identical)[0]
        raise ConfigError(f"{ann}: the split would leak ({leaks.count} pairs, first: {first}); nothing written")
    report = SplitReport(by, seed, len(roots), before - len(roots))
    out = Path(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    tmp.mkdir(parents=True)
    names = {c["id"]: str(c.get("name", c["id"])) for c in raw["categories"]}
    for name in ratios:
        keep = {entries[i]["id"] for i in range(len(entries)) if where[i] == name}
        anns = [a for a in raw["annotations"] if a["image_id"] in keep]
        per_class = dict.fromkeys(names.values(), 0)
        for a in anns:
            per_class[names[a["category_id"]]] += 0 if a.get("iscrowd", 0) else 1
        data = {**raw, "images": [e for e in entries if e["id"] in keep], "annotations": anns,
                "info": {**(raw.get("info") if isinstance(raw.get("info"), dict) else {}),
                         "musubi_split": {"name": name, "source": str(ann), "by": by, "seed": seed,
                                          "ratios": ratios}}}
        (tmp / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")
        report.splits[name] = {"annotations": str(out / f"{name}.json"), "images": len(keep), "boxes": len(anns),
                               "groups": len({group_of[i] for i in range(len(entries)) if where[i] == name}),
                               "classes_without_boxes": [c for c, k in per_class.items() if k == 0]}
    if out.exists():
        out.rmdir()  # checked empty by the caller; rmdir refuses otherwise (nothing is overwritten)
    tmp.rename(out)
    return report
