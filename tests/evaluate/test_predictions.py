"""`musubi evaluate JOB --predictions FILE`: COCO results a user scores with faster-coco-eval or pycocotools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from musubi.cli import app
from musubi.data.coco import CocoDetection
from musubi.evaluate.predictions import coco_results
from tests.data.sets import edit, small_set
from tests.evaluate.jobs import make_task_job

coco_eval = pytest.importorskip("faster_coco_eval")


def _set(root: Path) -> Path:
    """Frames of 160x120 with category ids 5 (Dead), 3 (Alive), 8 (Person): neither contiguous nor ordered."""
    ann = small_set(root, images=4, width=160, height=120, objects=5)

    def ids(d: dict) -> None:
        d["categories"] = [{"id": 5, "name": "Dead"}, {"id": 3, "name": "Alive"}, {"id": 8, "name": "Person"}]
        for n, a in enumerate(d["annotations"]):
            a["category_id"] = (5, 3, 8)[n % 3]
            a["image_id"] += 40  # image ids that are not positions either
        for i in d["images"]:
            i["id"] += 40

    return edit(ann, ids)


def _map50(gt: Path | dict, results: list[dict]) -> float:
    truth = coco_eval.COCO(str(gt)) if isinstance(gt, Path) else coco_eval.COCO(gt)
    ev = coco_eval.COCOeval_faster(truth, truth.loadRes(results), "bbox", print_function=lambda *a: None)
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return float(ev.stats[1])


@pytest.mark.parametrize("classes", [None, {"Dead": "tree", "Alive": "tree"}])
def test_perfect_predictions_score_one_in_file_pixels_and_file_ids(tmp_path: Path, classes: dict | None) -> None:
    # The model sees images resized to 96 px and labels 1..K; the results must be back in the file's terms.
    ann = _set(tmp_path / "set")
    ds = CocoDetection(tmp_path / "set" / "images", ann, image_size=96, classes=classes)
    rows = []
    for i in range(len(ds)):
        image, target = ds[i]
        w, h = ds.file_size(i)
        out = {"boxes": target["boxes"], "scores": target["labels"].float() * 0 + 1, "labels": target["labels"]}
        rows += coco_results(int(target["image_id"]), out, ds.category_ids, (w / image.shape[-1], h / image.shape[-2]))
    assert {r["image_id"] for r in rows} <= {41, 42, 43, 44}
    if classes is None:
        assert _map50(ann, rows) == pytest.approx(1.0)
        assert {r["category_id"] for r in rows} == {3, 5, 8}
    else:
        from musubi.data.classmap import apply_class_map
        from musubi.data.coco import read_annotation_json

        assert {r["category_id"] for r in rows} == {3, 8}  # tree keeps the smaller id of Dead/Alive
        assert _map50(apply_class_map(read_annotation_json(ann), classes, ann), rows) == pytest.approx(1.0)


@pytest.mark.slow  # a detector built, checkpointed, loaded and run on the CPU: ~25 s on 2 busy cores
def test_evaluate_writes_a_results_file_that_coco_tools_read(tmp_path: Path) -> None:
    ann = _set(tmp_path / "set")
    split = {"path": str(tmp_path / "set" / "images"), "annotations": str(ann)}
    job = make_task_job(tmp_path / "run", {
        "name": "det", "task": "detection", "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
        "model_args": {"rpn_pre_nms_top_n_test": 50, "rpn_post_nms_top_n_test": 20, "box_score_thresh": 0.0},
        "data": {"train": split, "val": split, "image_size": 96, "classes": {"Dead": "tree", "Alive": "tree"},
                 "workers": 0}}, steps=0)  # an untrained model: the file, not the quality, is tested
    out = tmp_path / "preds.json"
    res = CliRunner().invoke(app, ["evaluate", str(job), "--predictions", str(out), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    truth = tmp_path / "preds.ground_truth.json"
    assert rows and str(truth) in res.output.replace("\n", "")
    assert {r["category_id"] for r in rows} <= {3, 8} and {r["image_id"] for r in rows} <= {41, 42, 43, 44}
    assert all(set(r) == {"image_id", "category_id", "bbox", "score"} and len(r["bbox"]) == 4 for r in rows)
    assert max(r["bbox"][0] + r["bbox"][2] for r in rows) > 96  # in the 160x120 file's pixels, not the model's
    assert 0.0 <= _map50(truth, rows) <= 1.0  # loadRes accepts it and COCO eval runs on it
    bad = CliRunner().invoke(app, ["evaluate", str(job), "--predictions", str(tmp_path / "no" / "p.json")])
    assert bad.exit_code == 2 and "does not exist; create it first" in bad.output


@pytest.mark.slow  # a 1-channel detector built, checkpointed, loaded and run on the CPU: ~10 s
@pytest.mark.timeout(300)
def test_predictions_of_a_one_channel_job_are_its_validation_predictions(tmp_path: Path) -> None:
    """16-bit single-channel frames (data.channels 1): the results file holds what the job's own validation
    predicts (frames read as 1 channel and standardised as in training), not a crash on 3-channel frames."""
    import torch

    from musubi.data.synthetic_files import SyntheticFiles, write_synthetic_coco
    from musubi.evaluate.model_io import load_job_model

    ann = write_synthetic_coco(tmp_path / "set", SyntheticFiles(
        images=3, width=96, height=96, num_classes=2, objects=3, min_object=20, max_object=40, thermal=True),
        workers=1)
    split = {"path": str(ann.parent / "images"), "annotations": str(ann)}
    job = make_task_job(tmp_path / "run", {
        "name": "thermal", "task": "detection", "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
        "model_args": {"min_size": 96, "max_size": 96, "rpn_pre_nms_top_n_test": 50,
                       "rpn_post_nms_top_n_test": 20, "box_score_thresh": 0.0},
        "data": {"train": split, "val": split, "channels": 1, "workers": 0}}, steps=1)
    out = tmp_path / "preds.json"
    res = CliRunner().invoke(app, ["evaluate", str(job), "--predictions", str(out), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    loaded = load_job_model(job)
    val = loaded.task.val_dataset()
    expected = []
    with torch.no_grad():
        for i in range(len(val)):
            image, target = val[i]
            assert image.shape[0] == 1  # the job's frames are single-channel
            pred = loaded.task.predict(loaded.model, loaded.task.to_device(loaded.task.collate([val[i]]),
                                                                           torch.device("cpu")))[0]
            expected += coco_results(int(target["image_id"]), pred, val.category_ids, (1.0, 1.0))
    assert rows and len(rows) == len(expected)
    key = lambda r: (r["image_id"], r["category_id"], r["score"], *r["bbox"])  # noqa: E731
    for got, want in zip(sorted(rows, key=key), sorted(expected, key=key), strict=True):
        assert got["image_id"] == want["image_id"] and got["category_id"] == want["category_id"]
        assert got["score"] == pytest.approx(want["score"], abs=2e-5)
        assert got["bbox"] == pytest.approx(want["bbox"], abs=2e-3)
