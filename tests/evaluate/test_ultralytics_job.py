"""An unedited Ultralytics job beside a built-in detector, for real: trained from its yaml (no weights downloaded),
its best.pt exported by Ultralytics in the job's own venv (tests/support/ultralytics_venv.py), timed by Musubi's
protocol, ranked, and shipped with its class names when it wins. One fleet run, several assertions."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from musubi.cli import app
from musubi.data.synthetic_files import SyntheticFiles, write_synthetic_coco
from musubi.data.yolo import coco_to_yolo
from musubi.evaluate.fps import CPU_FPS_THREADS
from tests.support.ultralytics_venv import ultralytics_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: What a user's script looks like: YOLOv8n from its yaml, nothing of Musubi in it. 25 epochs of 2 steps at 64 px
#: (~20 s on 2 cores) take this easy set (one class, large objects) to mAP50 ~0.5; validation at the end only.
TRAIN_YOLO = '''
import sys
from ultralytics import YOLO

YOLO("yolov8n.yaml").train(data=sys.argv[1], epochs=25, imgsz=64, batch=16, workers=0, device="cpu",
                           pretrained=False, plots=False, amp=False, mosaic=0.0, val=False, seed=0,
                           deterministic=True, warmup_epochs=0, optimizer="AdamW", lr0=0.01)
'''


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = ultralytics_python()
    root = tmp_path_factory.mktemp("ultra")
    ann = write_synthetic_coco(root / "coco", SyntheticFiles(images=32, width=96, height=96, num_classes=1,
                                                            objects=2, min_object=30, max_object=60, seed=3))
    coco_to_yolo(ann, root / "coco" / "images", root / "yolo", val=(ann, root / "coco" / "images"))
    (root / "train_yolo.py").write_text(TRAIN_YOLO, encoding="utf-8")
    coco = {"path": str(root / "coco" / "images"), "annotations": str(ann)}
    fleet = {
        "name": "ultra",
        "leaderboard": {"export_top": 1, "promote": True},
        "jobs": [
            {"name": "yolo", "command": ["train_yolo.py", str(root / "yolo" / "data.yaml")], "python": str(python),
             # offline, and its settings in the run's folder rather than the user's home
             "env": {"YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(root / "ultralytics-settings")},
             "metrics_from": "ultralytics"},
            {"name": "frcnn", "task": "detection", "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
             "model_args": {"min_size": 96, "max_size": 96, "rpn_pre_nms_top_n_test": 50,
                            "rpn_post_nms_top_n_test": 20},
             "data": {"train": coco, "val": coco, "workers": 0},
             "train": {"epochs": 1, "batch": 8, "log_every": 2}},
        ],
    }
    path = root / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet), encoding="utf-8")
    out = root / "run"
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--device", "cpu", "--cpu-slots", "2"])
    return {"res": res, "out": out, "said": " ".join(res.output.split())}


def test_ultralytics_job_ranked_by_the_shared_protocol(fleet_run: dict[str, Any]) -> None:
    out, res = fleet_run["out"], fleet_run["res"]
    assert res.exit_code == 0, res.output
    record = json.loads((out / "yolo" / "eval.json").read_text())
    made = record["model_export"]
    assert made["framework"].startswith("ultralytics 8.4.") and made["nms"] is True, made
    assert "nms=True" in made["call"] and (out / "yolo" / "model.onnx").is_file()
    assert record["classes"] == ["class1"] and record["framework"]["version"].startswith("8.4.")
    assert "mAP50-95 alone" in record["source"]["selected"]
    # The headline FPS: the TorchScript export through torch on the CPU at CPU_FPS_THREADS, on a real validation
    # image letterboxed by Ultralytics, like the built-in job's torch-cpu figure; ONNX Runtime beside it.
    fps = record["fps"]
    assert fps["runtime"] == "torch-cpu" and fps["threads"] == CPU_FPS_THREADS, fps
    assert "one real validation sample" in fps["protocol"] and fps["input_shape"] == [1, 3, 64, 64]
    assert set(record["fps_all"]) == {"torch-cpu", "onnxruntime-cpu"}
    board = json.loads((out / "leaderboard.json").read_text())
    rows = {r["job"]: r for r in board["rows"]}
    assert rows["yolo"]["rank"] == 1 and rows["yolo"]["fps_runtime"] == "torch-cpu", rows["yolo"]
    assert rows["frcnn"]["fps_runtime"] == "torch-cpu" and rows["frcnn"]["fps_threads"] == CPU_FPS_THREADS
    assert "warning" not in board, board.get("warning")  # one runtime, one device, one thread count


def test_the_winner_is_said_and_shipped_with_its_names(fleet_run: dict[str, Any]) -> None:
    out, said = fleet_run["out"], fleet_run["said"]
    assert "yolo: registered the ONNX export of its best.pt (ultralytics 8.4." in said, said[-3000:]
    assert "NMS included) (external job) as yolo v1 (rank 1 of map50); promoted" in said
    assert "map50: the best is yolo (external job, score" in said and "shipped: yolo v1 (rank 1 of map50)" in said
    manifest = json.loads((out / "manifest.json").read_text())
    top = next(m for m in manifest["models"] if m["name"] == "yolo")
    assert top["classes"] == ["class1"] and top["rank"] == 1
    assert top["files"][0]["path"].endswith("yolo/model.onnx") and top["fps"]["runtime"] == "torch-cpu"
    item = next(i for i in json.loads((out / "checklist.json").read_text())["items"] if i["check"] == "export")
    assert item["status"] == "PASS" and "map50: best yolo (external: the ONNX export of its best.pt" in \
        item["found"] and "shipped yolo" in item["found"], item
