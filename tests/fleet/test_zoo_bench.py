"""bench/zoo.py's own logic: the archive that must come back from the device, and the CPU rehearsal sizes."""

from __future__ import annotations

import importlib.util
import tarfile
from pathlib import Path

import yaml

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("zoo_bench", REPO / "bench" / "zoo.py")
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)


def test_archive_keeps_results_and_leaves_out_weights(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for rel, size in {"fleet.json": 10, "fleet.log": 10, "a/eval.json": 10, "a/metrics.jsonl": 10,
                      "a/checkpoints/step-3/state.json": 10, "a/export/model.onnx": 10, "a/weights.pt": 10,
                      "a/telemetry/rank0.jsonl": 3000}.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_bytes(b"x" * size)
    (tmp_path / "zoo.json").write_text("{}")
    skipped = zoo.archive(tmp_path, tmp_path / "out.tgz", cap=1000)
    with tarfile.open(tmp_path / "out.tgz") as tar:
        names = set(tar.getnames())
    assert names == {"zoo/zoo.json", "zoo/skipped.txt", "zoo/run/fleet.json", "zoo/run/fleet.log",
                     "zoo/run/a/eval.json", "zoo/run/a/metrics.jsonl"}
    assert sorted(s.split()[0] for s in skipped) == ["run/a/checkpoints/step-3/state.json", "run/a/export/model.onnx",
                                                     "run/a/telemetry/rank0.jsonl", "run/a/weights.pt"]


def test_small_sizes_shrink_every_job_of_the_4gpu_zoo() -> None:
    fleet = yaml.safe_load((REPO / "examples" / "fleet-zoo-4gpu.yaml").read_text())
    zoo.shrink(fleet)
    assert fleet["defaults"]["train"]["max_steps"] == 3 and "epochs" not in fleet["defaults"]["train"]
    rgb, thermal = fleet["jobs"][0]["data"], fleet["jobs"][1]["data"]
    assert rgb["synthetic"]["image_size"] == 64 and thermal["image_size"] == 64 and thermal["channels"] == 1
    by_model = {j["model"]: j["model_args"] for j in fleet["jobs"]}
    assert by_model["rtdetr_r18"]["d_model"] == 32 and by_model["dfine_n"]["d_model"] == 32
    assert by_model["efficientdet_d0"]["image_size"] == 64
    assert by_model["fasterrcnn_mobilenet_v3_large_320_fpn"]["min_size"] == 64
