"""Export of models trained from image files (JPEG and PNG): the loader's uint8 frames become the model's
own input, both exporters, parity with the sample mAP of torch and ONNX, and an altered graph refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from musubi.contract.errors import ConfigError
from musubi.evaluate import export_job
from musubi.evaluate.model_io import JobModel, load_job_model
from musubi.evaluate.onnx_export import export_loaded
from tests.data.sets import small_set
from tests.evaluate.jobs import make_task_job


def coco_files(root: Path, fmt: str) -> tuple[Path, Path]:
    """`musubi data synth` frames (JPEG) as they are, or re-saved as PNG with the annotations renamed."""
    ann = small_set(root, images=4, width=96, height=64)
    if fmt == "png":
        data = json.loads(ann.read_text())
        for image in data["images"]:
            jpg = root / "images" / image["file_name"]
            image["file_name"] = jpg.with_suffix(".png").name
            Image.open(jpg).save(jpg.with_suffix(".png"))
            jpg.unlink()
        ann.write_text(json.dumps(data))
    return root / "images", ann


def detector_job(root: Path, fmt: str) -> Path:
    images, ann = coco_files(root / "data", fmt)
    split = {"path": str(images), "annotations": str(ann)}
    config = {"name": f"det-{fmt}", "task": "detection", "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
              # few proposals and the frames' own size: fast on a CPU; the default score threshold (0.05)
              # keeps boxes of a barely trained detector, so parity compares real detections
              "model_args": {"rpn_pre_nms_top_n_test": 100, "rpn_post_nms_top_n_test": 50,
                             "rpn_batch_size_per_image": 32, "box_batch_size_per_image": 32,
                             "min_size": 64, "max_size": 96},
              "data": {"train": split, "val": split, "workers": 0}}
    return make_task_job(root / "run", config, steps=1)


def assert_detector_export(record: dict) -> None:
    """The export record of a detector trained from image files: float frames in [0, 1], parity on real detections."""
    assert record["inputs"][0]["dtype"] == "float32" and record["input_info"]["range"].startswith("[0, 1]")
    parity = record["parity"]
    assert parity["ok"] and parity["torch_detections"] > 0 and parity["score_mismatch"] == 0
    assert parity["map"]["onnx"] == parity["map"]["torch"]  # ONNX predictions score the same mAP


def assert_dynamo_refused(job: Path, loaded: JobModel | None = None) -> None:
    """dynamo cannot trace torchvision detectors: refused in one line, and nothing is left behind
    (through `export_job`, or `export_loaded` where the test holds the loaded model already)."""
    with pytest.raises(ConfigError, match="--exporter torchscript") as info:
        export_job(job, exporter="dynamo") if loaded is None else export_loaded(loaded, exporter="dynamo")
    assert "\n" not in str(info.value) and not (job / "export").exists()


@pytest.mark.slow
def test_detector_from_png_files_exports_with_parity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PNG frames; the JPEG detector is the torchrun test's below (trained on 2 ranks, exported the same way).
    The model is loaded once for the four checks, as the evaluation step does (`export_loaded`): a load reads
    the checkpoint and builds the detector, seconds on a CPU; `export_job`'s own load is the torchrun test's."""
    job = detector_job(tmp_path, "png")
    loaded = load_job_model(job)
    assert_dynamo_refused(job, loaded)
    assert_detector_export(export_loaded(loaded, exporter="torchscript"))
    assert_altered_export_names_its_disagreements(loaded, monkeypatch)


def assert_altered_export_names_its_disagreements(loaded: JobModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """An export whose graph computes other scores (box head weights scaled by 2 between export and parity) fails
    the parity check (real disagreements, nothing explained upstream) and is refused in one line that names the
    first disagreements (image, class name, score, box) and the file with all of them; the earlier good export
    stays. (The parity verdict is read from that refused export's record: the same check_parity on the same
    altered graph, one export and probe fewer than checking a separately altered copy.)"""
    import onnx

    from musubi.evaluate import onnx_export
    from musubi.evaluate.onnx_export import ParityError

    stamp = onnx_export.stamp_onnx

    def stamp_and_alter(path: Path, recipe: dict) -> None:
        stamp(path, recipe)
        model = onnx.load(str(path))
        for t in model.graph.initializer:
            if "box_predictor" in t.name and t.data_type == 1:
                t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t) * np.float32(2.0), t.name))
        onnx.save(model, str(path))

    good = (loaded.job_dir / "export" / "model.onnx").read_bytes()
    monkeypatch.setattr(onnx_export, "stamp_onnx", stamp_and_alter)
    with pytest.raises(ParityError) as info:
        export_loaded(loaded, exporter="torchscript")
    said = str(info.value)
    failed = json.loads((loaded.job_dir / "export" / "export-failed.json").read_text())["parity"]
    first = failed["disagreements"][0]
    assert "\n" not in said and "real disagreement(s)" in said and "export-failed.json" in said
    assert f"image {first['image']}" in said and f"'{first['name']}' score" in said and str(first["box"]) in said
    assert first["name"] in loaded.task.class_names() and first["why"]  # the recipe's names (annotation file)
    assert not failed["ok"] and "real disagreement(s)" in failed["problem"], failed
    assert failed["disagreements"] and all(d["real"] for d in failed["disagreements"])
    # The R-CNN's proposal probe is the shipped model's graph, not the altered file: nothing is explained upstream.
    assert failed["proposals"] and not any(p["same_graph"] for p in failed["proposals"])
    assert (loaded.job_dir / "export" / "model.onnx").read_bytes() == good


@pytest.mark.slow
def test_classifier_from_image_files_exports_with_both_exporters(tmp_path: Path) -> None:
    """An image folder with a JPEG class and a PNG class; torchscript and dynamo both export it."""
    rng = np.random.default_rng(0)
    for cls, ext in (("a", "jpg"), ("b", "png")):
        (tmp_path / "data" / cls).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / cls / f"{i}.{ext}")
    split = {"path": str(tmp_path / "data")}
    config = {"name": "cls-files", "task": "classification", "model": "resnet18",
              "data": {"train": split, "val": split, "image_size": 32, "workers": 0}}
    job = make_task_job(tmp_path / "run", config, steps=1)
    for exporter in ("torchscript", "dynamo"):
        record = export_job(job, exporter=exporter, parity_inputs=2)
        assert record["exporter"] == exporter and record["parity"]["ok"], record["parity"]
        assert record["inputs"][0]["dtype"] == "float32"


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_torchrun_detector_stopped_mid_epoch_is_validated_and_exports(tmp_path: Path) -> None:
    """The issue's path: `musubi train` on 2 CPU ranks from JPEG files, ended by train.max_steps inside the
    first epoch; eval.json has the metrics, the checklist says so, and `musubi export` succeeds with parity
    (the JPEG case of the in-process PNG test above: one detector trained and exported, not two)."""
    import yaml
    from typer.testing import CliRunner

    from musubi.cli import app
    from tests.support.runs import train

    images, ann = coco_files(tmp_path / "data", "jpg")
    split = {"path": str(images), "annotations": str(ann)}
    job = {"name": "det", "task": "detection", "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
           "model_args": {"rpn_pre_nms_top_n_test": 100, "rpn_post_nms_top_n_test": 50,
                          "rpn_batch_size_per_image": 32, "box_batch_size_per_image": 32,
                          "min_size": 64, "max_size": 96},
           "data": {"train": split, "val": split, "workers": 0},
           # 4 frames / (2 ranks x 1) = 2 steps per epoch: max_steps 1 stops inside the first epoch
           "train": {"batch": 1, "epochs": 1, "max_steps": 1, "lr": 0.001}}
    path = tmp_path / "det.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    code, out = train(str(path), "--nproc", "2", "--out", str(tmp_path / "run"), "--no-check")
    assert code == 0, out
    job_dir = tmp_path / "run" / "det"
    evals = json.loads((job_dir / "eval.json").read_text())
    assert evals["step"] == 1 and {"map50", "map"} <= set(evals["metrics"])
    # Every detection scored (no metric cap), the model's own cap stated with the setting that moves it.
    caps = evals["max_detections"]
    assert (caps["metric"], caps["model"], caps["model_set_by"]) == ("all", 100, "model_args.box_detections_per_img")
    assert caps["most_objects_in_a_validation_image"] >= 1 and "warning" not in caps
    checklist = json.loads((tmp_path / "run" / "checklist.json").read_text())
    assert [i["status"] for i in checklist["items"] if i["check"] == "eval"] == ["PASS"]
    # The loss's parts are logged beside the total (averaged over both ranks), and the report plots them.
    (line,) = [r for r in map(json.loads, (job_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    parts = ("loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg")
    assert all(isinstance(line.get(p), float) and line[p] >= 0 for p in parts), line
    assert abs(sum(line[p] for p in parts) - line["loss"]) < 1e-4 * max(1.0, line["loss"]), line
    res = CliRunner().invoke(app, ["report", str(job_dir), "--html", str(tmp_path / "report.html")])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    curves = html[html.index("<h3>Training curves</h3>"):html.index("<h3>Step-time breakdown")]
    assert all(p in curves for p in parts) and "Loss parts" in curves
    assert_dynamo_refused(job_dir)
    res = CliRunner().invoke(app, ["export", str(job_dir)])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "parity ok on 4 input(s)" in said and "sample mAP50 torch 0 / onnx 0" in said
    assert (job_dir / "export" / "model.onnx").is_file()
    assert_detector_export(json.loads((job_dir / "export" / "export.json").read_text()))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rcnn_differences_at_its_rpn_ties_are_explained(tmp_path: Path) -> None:
    """The issue's case: a Faster R-CNN 320 trained a step on generated 320x240 JPEG frames, every box kept
    (threshold 0: 100 an image, 400 in all). Its RPN scores flat regions alike, torch and ONNX Runtime keep
    other anchors of exactly tied objectness, and the box head returns detections on one side only. The
    export passes: each difference is classified (the proposals probed and the box head replayed on ONNX
    Runtime's), counted in export.json, and the sample mAP is the same both ways."""
    ann = small_set(tmp_path / "data", images=4, width=320, height=240)
    split = {"path": str(tmp_path / "data" / "images"), "annotations": str(ann)}
    config = {"name": "det-320", "task": "detection", "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
              "model_args": {"box_score_thresh": 0.0}, "data": {"train": split, "val": split, "workers": 0}}
    job = make_task_job(tmp_path / "run", config, steps=1)
    record = export_job(job)
    parity = record["parity"]
    assert parity["ok"] and parity["torch_detections"] == parity["ort_detections"] == 400, parity.get("problem")
    assert parity["map"]["onnx"] == parity["map"]["torch"] and "disagreements" not in parity
    assert parity["max_box_diff_px"] < 1e-3 and json.loads((job / "export" / "export.json").read_text()) == \
        json.loads(json.dumps(record))
    if not parity["kinds"]:
        pytest.skip("torch and ONNX Runtime broke every tie alike with these versions: nothing to explain")
    from musubi.evaluate.parity import EXPLAINED

    assert set(parity["kinds"]) <= set(EXPLAINED) and parity["explained"] == sum(parity["kinds"].values())
    assert len(parity["differences"]) == parity["explained"] and all(not d["real"] for d in parity["differences"])
    # Measured here (torch 2.14, onnxruntime CPU): differences the output alone cannot explain, explained by
    # the RPN's own ties, with torch's box head on ONNX Runtime's proposals giving ONNX Runtime's boxes exactly.
    assert parity["kinds"].get("proposals", 0) > 0
    for probe in parity["proposals"]:
        # Exact here (torch 2.14); torch 2.11 (the GPU machine's CPU suite) left one NMS tie in the replay: what
        # the replay does not reproduce must itself be an explained kind, every other box exact.
        assert probe["same_graph"] and set(probe["replay_kinds"]) <= set(EXPLAINED) - {"proposals"}
        assert probe["replay_exact"] >= 100 - sum(probe["replay_kinds"].values())
        assert set(probe["kinds"]) <= set(EXPLAINED) - {"proposals"}
