"""`musubi predict` and `musubi.predict`: the boxes of evaluation, from a job, an export or the registry.

Issue 42's proof: on the validation image files (JPEG and PNG written to disk), `predict` gives the boxes
`musubi evaluate --predictions` gives for the same checkpoint (every box matched at IoU >= 0.99, scores within
1e-3), for an RGB job, a `channels: 1` job and a sliced job (tiled and merged as evaluation did), and the
exports (.onnx through ONNX Runtime, .pt rebuilt from weights.json) give them again, with class names.
The detectors are untrained Faster R-CNN ResNet-50 FPNs (steps=0): quality is not under test, and an
untrained MobileNet one answers the same for every frame (a bug mixing frames up would pass).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import musubi
from musubi.cli import app
from musubi.contract.errors import ConfigError
from musubi.evaluate.fps import CPU_FPS_THREADS
from tests.evaluate.boxes import textured_set, unmatched
from tests.evaluate.jobs import make_task_job

pytest.importorskip("onnxruntime")

DETECTOR = {"task": "detection", "model": "fasterrcnn_resnet50_fpn",
            "model_args": {"rpn_pre_nms_top_n_test": 60, "rpn_post_nms_top_n_test": 30, "box_score_thresh": 0.0,
                           "box_detections_per_img": 40}}


def _job(root: Path, name: str, data: dict[str, Any], thermal: bool = False, images: int = 4) -> Path:
    ann = textured_set(root / "set", images=images, thermal=thermal)
    split = {"path": str(root / "set" / "images"), "annotations": str(ann)}
    return make_task_job(root / "run", {**DETECTOR, "name": name,
                                        "data": {"train": split, "val": split, "workers": 0, **data}}, steps=0)


@pytest.fixture(scope="module")
def rgb_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _job(tmp_path_factory.mktemp("rgb"), "det-rgb", {"image_size": 96})


@pytest.fixture(scope="module")
def thermal_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _job(tmp_path_factory.mktemp("thermal"), "det-thermal",
                {"image_size": 96, "channels": 1, "one_channel": "replicate"}, thermal=True)


@pytest.fixture(scope="module")
def sliced_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # two frames (a JPEG and a PNG): each is 9 tiles through a ResNet-50 on every pass, the file's largest cost;
    # two frames still tell a frame mix-up, and the tiling and merging are per frame
    return _job(tmp_path_factory.mktemp("sliced"), "det-sliced",
                {"slice": {"tile": 64, "overlap": 0.25, "merge": "nmm", "empty_ratio": 1.0}}, images=2)


class Predicted:
    """One `musubi predict JOB IMAGES --save-images` of a module's job: its console output, folder and rows."""

    def __init__(self, job: Path, out: Path) -> None:
        self.job, self.out = job, out
        self.images = Path(json.loads((job / "job.json").read_text())["config"]["data"]["val"]["path"])
        res = CliRunner().invoke(app, ["predict", str(job), str(self.images), "--out", str(out), "--device", "cpu",
                                       "--save-images"])
        assert res.exit_code == 0, res.output
        self.output = res.output
        self.rows: list[dict[str, Any]] = json.loads((out / "predictions.json").read_text())


@pytest.fixture(scope="module")
def predicted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """`predicted(fixture_name)`: the job's CLI predictions, made once a module (the detectors run on the CPU:
    each pass over a set costs seconds, so the tests that compare other paths with them share one)."""
    done: dict[str, Predicted] = {}

    def get(fixture: str) -> Predicted:
        if fixture not in done:
            done[fixture] = Predicted(request.getfixturevalue(fixture), tmp_path_factory.mktemp(f"pred-{fixture}"))
        return done[fixture]

    return get


def _evaluation(job: Path, out: Path) -> list[dict[str, Any]]:
    """`musubi evaluate JOB --predictions` rows, keyed by file name (from the annotation file's image ids)."""
    res = CliRunner().invoke(app, ["evaluate", str(job), "--predictions", str(out), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    spec = json.loads((job / "job.json").read_text())["config"]
    names = {i["id"]: i["file_name"] for i in json.loads(Path(spec["data"]["val"]["annotations"]).read_text())["images"]}
    return [{**r, "file_name": names[r["image_id"]]} for r in json.loads(out.read_text())]


@pytest.mark.slow  # three untrained detectors built, checkpointed and run on the CPU
@pytest.mark.timeout(900)
@pytest.mark.parametrize("fixture", ["rgb_job", "thermal_job", "sliced_job"])
def test_predict_gives_the_boxes_of_evaluation(fixture: str, request: pytest.FixtureRequest, predicted,
                                               tmp_path: Path) -> None:
    job = request.getfixturevalue(fixture)
    expected = _evaluation(job, tmp_path / "eval.json")
    cli = predicted(fixture)
    images, out, rows, res = cli.images, cli.out, cli.rows, cli
    assert len(rows) > 20 and len({tuple(r["bbox"]) for r in rows}) > len(rows) // 2  # frames answer differently
    assert unmatched(rows, expected) == []
    assert {r["category_name"] for r in rows} <= {"car", "person"} and {r["category_id"] for r in rows} <= {3, 7}
    assert "frame_1.png:" in res.output and "detections (" in res.output  # one line an image, with class names
    assert sorted(p.name for p in (out / "images").iterdir()) == sorted(f"{p.name}.png" for p in images.iterdir())
    recipe = json.loads((out / "predict.json").read_text())["recipe"]
    assert recipe["classes"] == ["person", "car"] and recipe["category_ids"] == [3, 7]  # label order: id order
    if fixture == "sliced_job":
        assert recipe["slice"]["tile"] == 64 and recipe["slice"]["merge"] == "nmm"
        assert recipe["measured"]["metrics"].startswith("whole frame")
    if fixture == "thermal_job":
        assert recipe["input"]["channels"] == 1 and recipe["input"]["replicate"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_exports_carry_names_and_rebuild_the_model_that_gives_its_boxes(rgb_job: Path, predicted,
                                                                       tmp_path: Path) -> None:
    import onnx
    import torchvision

    from musubi.evaluate.model_io import load_job_model
    from musubi.evaluate.onnx_export import export_job
    from musubi.evaluate.registry import get_model, promote, register, write_manifest
    from musubi.evaluate.weights_export import export_weights
    from musubi.tasks.rebuild import rebuild_model

    images = rgb_job.parent.parent / "set" / "images"
    reference = predicted("rgb_job").rows  # the job's own boxes (`musubi predict`, = evaluation's: the test above)
    record = export_job(rgb_job)
    assert record["classes"] == ["person", "car"] and record["recipe"]["input"]["resize_longest"] == 96
    meta = {p.key: p.value for p in onnx.load(str(rgb_job / "export" / "model.onnx")).metadata_props}
    assert json.loads(meta["musubi.classes"]) == ["person", "car"]
    assert json.loads(meta["musubi.recipe"])["category_ids"] == [3, 7]
    assert unmatched(musubi.predict(rgb_job / "export" / "model.onnx", images, device="cpu").rows, reference) == []

    weights = export_weights(rgb_job)
    info = json.loads((rgb_job / "export" / "weights.json").read_text())
    assert info["num_classes"] == 2 and info["classes"] == ["person", "car"] and info["image_size"] == 96
    assert info["builder"]["kwargs"]["min_size"] == 96 and "box_detections_per_img=40" in info["build"]
    assert weights["recipe"] == info["recipe"]
    assert unmatched(musubi.predict(rgb_job / "export" / "model.pt", images, device="cpu").rows, reference) == []
    # The cause of issue 42's 8 boxes against 71: the detector rebuilt from its name alone resizes to 800 px,
    # keeps torchvision's thresholds and answers otherwise; the one weights.json describes answers the same.
    state = torch.load(rgb_job / "export" / "model.pt", weights_only=True)
    x = [torch.rand(3, 72, 96, generator=torch.Generator().manual_seed(0))]
    rebuilt = rebuild_model(info["builder"])
    rebuilt.load_state_dict(state)
    naive = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None,
                                                                 num_classes=3).eval()
    naive.load_state_dict(state)
    with torch.no_grad():
        trained, again, guessed = load_job_model(rgb_job).model(x)[0], rebuilt(x)[0], naive(x)[0]
    assert torch.equal(trained["boxes"], again["boxes"]) and torch.equal(trained["scores"], again["scores"])
    assert len(guessed["boxes"]) != len(trained["boxes"]) or not torch.allclose(guessed["boxes"], trained["boxes"])

    db = tmp_path / "musubi.db"
    entry = register(rgb_job, db=db)
    promote(entry["name"], entry["version"], db=db)
    assert get_model(entry["name"], entry["version"], db=db)["input"]["classes"] == ["person", "car"]
    manifest = write_manifest(tmp_path / "manifest.json", db=db)
    model = manifest["models"][0]
    assert model["classes"] == ["person", "car"] and model["slice"] is None
    assert model["measured"] == {"metrics": "whole image", "fps": "whole image"}
    by_name = musubi.predict(entry["name"], images, device="cpu", db=db)
    assert by_name.model.startswith(f"{entry['name']} v1") and unmatched(by_name.rows, reference) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sources_arrays_globs_and_refusals(rgb_job: Path, predicted, tmp_path: Path) -> None:
    from PIL import Image

    images = rgb_job.parent.parent / "set" / "images"
    whole = predicted("rgb_job")  # the folder through `musubi predict`; the API below takes an array and a glob
    frame = np.asarray(Image.open(images / "frame_1.png").convert("RGB"))
    from_array = musubi.predict(rgb_job, [frame], device="cpu")
    assert from_array.images[0].name == "array0" and from_array.images[0].names
    ours = [{**r, "file_name": "frame_1.png"} for r in from_array.rows]
    assert unmatched(ours, [r for r in whole.rows if r["file_name"] == "frame_1.png"]) == []
    globbed = musubi.predict(rgb_job, str(images / "*.png"), device="cpu", conf=0.5)
    assert [i.name for i in globbed.images] == ["frame_1.png", "frame_3.png"]
    assert all(r["score"] >= 0.5 for r in globbed.rows)
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"\x00" * 64)
    try:
        import av  # noqa: F401
    except ImportError:
        try:
            import cv2  # noqa: F401
        except ImportError:
            with pytest.raises(ConfigError, match="reading a video needs a reader: pip install av"):
                musubi.predict(rgb_job, video, device="cpu")
    with pytest.raises(ConfigError, match="a score threshold in"):  # refused before any model is looked up
        musubi.predict(tmp_path / "no-such-job", images, device="cpu", conf=2)
    runner = CliRunner()
    for args, message in (
        (["predict", str(rgb_job), str(tmp_path / "none")], "no such file or folder"),
        (["predict", str(rgb_job), str(images), "--checkpoint", "7"], "committed steps: 1"),
        (["predict", str(rgb_job), str(images), "--checkpoint", "soon"], "give best, last or a step number"),
        (["predict", str(rgb_job), str(images), "--conf", "2"], "a score threshold in [0, 1]"),
        (["predict", "no-such-model", str(images), "--db", str(tmp_path / "x.db")], "no such registry database"),
        (["predict", str(tmp_path), str(images)], "not a job directory"),
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and message in res.output.replace("\n", ""), (args, res.output)
    done = runner.invoke(app, ["predict", str(rgb_job), str(images / "frame_0.jpg"), "--out", str(tmp_path / "o")])
    assert done.exit_code == 0, done.output
    again = runner.invoke(app, ["predict", str(rgb_job), str(images / "frame_0.jpg"), "--out", str(tmp_path / "o")])
    assert again.exit_code == 2 and "already holds predictions.json" in again.output


EDGE = Path(__file__).resolve().parents[2] / "examples" / "edge" / "edge_predict.py"


def test_edge_script_imports_only_onnxruntime_numpy_and_pillow() -> None:
    import ast

    tree = ast.parse(EDGE.read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported - {"__future__", "argparse", "hashlib", "json", "sys", "pathlib", "typing"} == \
        {"numpy", "onnxruntime", "PIL"}


def test_edge_script_refuses_a_thread_count_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("edge_predict", EDGE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as stop:
        module.main([str(tmp_path / "manifest.json"), str(tmp_path / "frame.jpg"), "--threads", "0"])
    assert stop.value.code == 2 and "--threads 0: give 1 or more" in capsys.readouterr().err


def edge_json(manifest: Path, images: list[Path]) -> list[dict[str, Any]]:
    """The edge script's `--json` answers for the images (one line each, one session for all), from its own main()
    loaded in this process (the same code a run as a program executes; the test runs it as a program too, where
    it must stand alone)."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location("edge_predict", EDGE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        # one intra-op thread: ONNX Runtime's default pool spins a thread a core beside the suite's other work
        code = module.main([str(manifest), *map(str, images), "--json", "--threads", "1"])
    assert code == 0, printed.getvalue()
    answers = [json.loads(line) for line in printed.getvalue().splitlines()]
    assert [a["image"] for a in answers] == list(map(str, images))  # one line an image, in order
    return answers


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("fixture", ["rgb_job", "sliced_job"])
def test_edge_script_gives_predicts_boxes_from_the_manifest_alone(fixture: str, request: pytest.FixtureRequest,
                                                                  predicted, tmp_path: Path) -> None:
    import subprocess
    import sys

    from musubi.evaluate.onnx_export import export_job
    from musubi.evaluate.registry import promote, register, write_manifest

    job = request.getfixturevalue(fixture)
    images = job.parent.parent / "set" / "images"
    if fixture == "sliced_job":  # exported by its evaluation: FPS through torch and ONNX Runtime, labelled
        from musubi.evaluate.job_eval import evaluate_job

        record = evaluate_job(job, device="cpu", export=True, fps_runs=2, fps_warmup=0)
        # 160x120 frames, 64 px tiles at overlap 0.25 (stride 48): 3 x 3 tiles, timed whole, merged
        assert record["fps"]["unit"].startswith("whole frame (9 tiles of 160x120): 64 px tiles")
        ort = record["fps_all"]["onnxruntime-cpu"]
        assert ort["unit"] == record["fps"]["unit"] and "once a tile" in ort["protocol"] and ort["fps"] > 0
        # timed at the thread count of every other CPU timing, and said so
        assert record["fps"]["threads"] == ort["threads"] == CPU_FPS_THREADS and "CPU_FPS_THREADS" in ort["protocol"]
    elif not (job / "export" / "model.onnx").is_file():
        export_job(job)
    db = tmp_path / "musubi.db"
    entry = register(job, db=db)
    promote(entry["name"], entry["version"], db=db)
    manifest = tmp_path / "manifest.json"
    model = write_manifest(manifest, db=db)["models"][0]
    assert model["classes"] == ["person", "car"]
    if fixture == "sliced_job":  # the deployable unit is what was measured: tile, overlap and merge shipped
        assert model["slice"]["tile"] == 64 and model["slice"]["overlap"] == 0.25 and model["slice"]["merge"] == "nmm"
        assert model["measured"]["metrics"].startswith("whole frame") and "9 tiles" in model["fps"]["unit"]
    reference = predicted(fixture).rows  # the job through torch (`musubi predict`, = evaluation's)
    ids = {1: 3, 2: 7}  # label -> the annotation file's category id
    rows = []
    files = sorted(images.iterdir())
    for image, answer in zip(files, edge_json(manifest, files), strict=True):
        for d in answer["detections"]:
            x1, y1, x2, y2 = d["box"]
            rows.append({"file_name": image.name, "category_id": ids[d["label"]], "bbox": [x1, y1, x2 - x1, y2 - y1],
                         "score": d["score"], "name": d["name"]})
    assert unmatched(rows, reference) == []  # the job through torch
    shipped = musubi.predict(entry["name"], images, device="cpu", db=db).rows  # the manifest's file, through predict
    assert unmatched(rows, shipped) == []
    assert {r["name"] for r in rows} == {"person", "car"}
    shown = subprocess.run([sys.executable, str(EDGE), str(manifest), str(images / "frame_0.jpg"), "--threads", "1"],
                           capture_output=True, text=True, timeout=300, check=False)
    assert shown.returncode == 0 and "detection(s)" in shown.stdout and ("car " in shown.stdout or
                                                                          "person " in shown.stdout), shown.stdout
    data = json.loads(manifest.read_text())
    data["models"][0]["files"][0]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(data))
    refused = subprocess.run([sys.executable, str(EDGE), str(manifest), str(images / "frame_0.jpg")],
                             capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2 and "differs from the manifest's" in refused.stderr


@pytest.mark.slow  # a classifier trained, exported twice and run four ways: ~80 s on 2 busy cores
@pytest.mark.timeout(600)
def test_classifier_predict_names_its_classes_from_job_onnx_and_pt(tmp_path: Path) -> None:
    from PIL import Image

    from musubi.evaluate.onnx_export import export_job
    from musubi.evaluate.weights_export import export_weights
    from tests.evaluate.jobs import CLASSIFY

    job = make_task_job(tmp_path / "run", CLASSIFY, steps=2)
    rng = np.random.default_rng(1)
    arrays = [(rng.random((40, 48, 3)) * 255).astype(np.uint8) for _ in range(3)]
    for n, a in enumerate(arrays):
        Image.fromarray(a).save(tmp_path / f"im{n}.png")
    files = sorted(tmp_path.glob("im*.png"))
    ours = musubi.predict(job, files, device="cpu", out=tmp_path / "out")
    assert ours.task == "classification" and ours.classes == ["class0", "class1", "class2", "class3"]
    rows = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert [r["file_name"] for r in rows] == ["im0.png", "im1.png", "im2.png"]
    assert all(r["category_name"] == f"class{r['category_id']}" for r in rows)
    export_job(job)
    export_weights(job)
    for model in (job / "export" / "model.onnx", job / "export" / "model.pt"):
        again = musubi.predict(model, files, device="cpu").rows
        assert [r["category_id"] for r in again] == [r["category_id"] for r in rows], model
        assert max(abs(a["score"] - b["score"]) for a, b in zip(again, rows, strict=True)) <= 1e-3, model
    assert musubi.predict(job, arrays[0], device="cpu").rows[0]["category_id"] == rows[0]["category_id"]
