"""`data.classes`: merge, rename and drop COCO categories as they are read; recorded in the dataset version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.config.load import job_from_dict
from musubi.contract.errors import ConfigError
from musubi.data.coco import CocoDetection
from musubi.data.job_version import dataset_version
from musubi.tasks.detection import DetectionTask

from .sets import edit, small_set

MAP = {"Dead": "tree", "Alive": "tree", "Person": "human", "Clutter": None}


def _four_class_set(root: Path) -> Path:
    """A small set whose boxes use four categories (ids 4, 2, 9, 5: not in name order)."""
    ann = small_set(root, images=3, objects=8)

    def four(d: dict) -> None:
        d["categories"] = [{"id": 4, "name": "Dead"}, {"id": 2, "name": "Alive"}, {"id": 9, "name": "Person"},
                           {"id": 5, "name": "Clutter"}]
        for n, a in enumerate(d["annotations"]):
            a["category_id"] = (4, 2, 9, 5)[n % 4]

    return edit(ann, four)


def test_a_class_map_equals_the_same_edit_made_in_the_file(tmp_path: Path) -> None:
    ann = _four_class_set(tmp_path / "set")
    mapped = CocoDetection(tmp_path / "set" / "images", ann, classes=MAP)
    # The same map written into a copy of the file by hand: Dead/Alive -> tree (id 2, the smaller), Person ->
    # human (id 9 kept), Clutter's boxes removed.
    by_hand = json.loads(ann.read_text())
    by_hand["categories"] = [{"id": 2, "name": "tree"}, {"id": 9, "name": "human"}]
    by_hand["annotations"] = [{**a, "category_id": {4: 2, 2: 2, 9: 9}[a["category_id"]]}
                              for a in by_hand["annotations"] if a["category_id"] != 5]
    (tmp_path / "set" / "by_hand.json").write_text(json.dumps(by_hand))
    plain = CocoDetection(tmp_path / "set" / "images", tmp_path / "set" / "by_hand.json")
    assert mapped.category_ids == plain.category_ids == (2, 9)
    assert mapped.category_names == plain.category_names == {2: "tree", 9: "human"}
    assert mapped.stats == plain.stats and mapped.stats.boxes == 18  # 24 boxes, the 6 Clutter ones dropped
    for i in range(len(mapped)):
        assert mapped[i][1]["labels"].tolist() == plain[i][1]["labels"].tolist()
        assert mapped[i][1]["boxes"].tolist() == plain[i][1]["boxes"].tolist()
    # Renaming to the name of a category left as it is merges into it.
    merged = CocoDetection(tmp_path / "set" / "images", ann, classes={"Dead": "Alive"})
    assert merged.category_names == {2: "Alive", 5: "Clutter", 9: "Person"}


@pytest.mark.parametrize(("classes", "message"), [
    ({"Deadd": "tree"}, r"has no category 'Deadd' \(it has Alive, Clutter, Dead, Person\); fix the name"),
    ({"Dead": None, "Alive": None, "Person": None, "Clutter": None}, "drops every category"),
    ({"Dead": " "}, "'Dead' maps to an empty name"),
])
def test_a_bad_map_is_one_line(tmp_path: Path, classes: dict, message: str) -> None:
    ann = _four_class_set(tmp_path / "set")
    with pytest.raises(ConfigError, match=message) as e:
        CocoDetection(tmp_path / "set" / "images", ann, classes=classes)
    assert "\n" not in str(e.value)


def _job(root: Path, ann: Path, classes: dict | None) -> dict:
    data: dict = {"train": {"path": str(root / "images"), "annotations": str(ann)},
                  "val": {"path": str(root / "images"), "annotations": str(ann)}}
    if classes is not None:
        data["classes"] = classes
    return {"name": "j", "task": "detection", "model": "fasterrcnn_mobilenet_v3_large_320_fpn", "data": data}


def test_the_job_trains_on_the_mapped_classes_and_the_map_is_part_of_the_version(tmp_path: Path) -> None:
    ann = _four_class_set(tmp_path / "set")
    task = DetectionTask(job_from_dict(_job(tmp_path / "set", ann, MAP)))
    assert task.num_classes == 2 and task.val_dataset().category_ids == (2, 9)  # type: ignore[union-attr]
    plain = dataset_version(_job(tmp_path / "set", ann, None))
    mapped = dataset_version(_job(tmp_path / "set", ann, MAP))
    other = dataset_version(_job(tmp_path / "set", ann, {**MAP, "Clutter": "tree"}))
    reordered = dataset_version(_job(tmp_path / "set", ann, dict(reversed(MAP.items()))))
    assert len({plain, mapped, other}) == 3 and reordered == mapped
    # A job without a map keeps the version it had before maps existed (the options digest is unchanged).
    assert plain == dataset_version({"data": {"train": _job(tmp_path / "set", ann, None)["data"]["train"],
                                              "val": _job(tmp_path / "set", ann, None)["data"]["val"]}})


def test_config_refuses_a_map_where_there_are_no_categories(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="synthetic data has none"):
        job_from_dict({"name": "j", "task": "detection", "model": "m",
                       "data": {"synthetic": {}, "classes": {"a": "b"}}})
    with pytest.raises(ConfigError, match="task classification does not read them"):
        job_from_dict({"name": "j", "task": "classification", "model": "m",
                       "data": {"train": {"path": "x"}, "classes": {"a": "b"}}})
    with pytest.raises(ConfigError, match="classes is empty"):
        job_from_dict({"name": "j", "task": "detection", "model": "m", "data": {"train": {"path": "x"}, "classes": {}}})
