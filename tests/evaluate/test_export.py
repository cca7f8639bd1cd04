"""ONNX export and parity: classification and user tasks, a trained detector, failures that keep old files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from musubi.contract.errors import ConfigError
from musubi.evaluate import evaluate_job, export_job, onnx_export
from musubi.evaluate.onnx_export import ParityError
from musubi.evaluate.parity import compare_tensors
from musubi.evaluate.registry import file_sha256
from tests.evaluate.jobs import CLASSIFY, DETECT, TINY_USER, make_task_job


@pytest.fixture(scope="module")
def cls_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_task_job(tmp_path_factory.mktemp("run"), CLASSIFY, steps=2, metrics={"top1": 0.5, "val_loss": 1.0})


def test_classifier_export_and_parity(cls_job: Path) -> None:
    record = export_job(cls_job)
    onnx_file = cls_job / "export" / "model.onnx"
    assert json.loads((cls_job / "export" / "export.json").read_text()) == json.loads(json.dumps(record))
    assert record["sha256"] == file_sha256(onnx_file) and record["bytes"] == onnx_file.stat().st_size
    assert record["opset"] == 17 and record["exporter"] == "torchscript" and record["dynamic_batch"]
    assert record["inputs"] == [{"name": "images", "shape": ["batch", 3, 32, 32], "dtype": "float32"}]
    assert record["outputs"][0]["shape"] == ["batch", 4]
    parity = record["parity"]
    assert parity["ok"] and parity["argmax_agreement"] == 1.0 and parity["max_abs_diff"] < 1e-3
    assert record["input_info"]["normalisation"].startswith("none: synthetic")
    # The symbolic batch axis really is one: ORT takes 3 images.
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    assert session.run(None, {"images": np.zeros((3, 3, 32, 32), np.float32)})[0].shape == (3, 4)


def test_failed_parity_keeps_the_earlier_export(cls_job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not (cls_job / "export" / "model.onnx").is_file():
        export_job(cls_job)
    before = file_sha256(cls_job / "export" / "model.onnx")
    monkeypatch.setattr(onnx_export, "compare_tensors",
                        lambda ref, got: {"ok": False, "problem": "forced mismatch"})
    with pytest.raises(ParityError, match="forced mismatch") as info:
        export_job(cls_job)
    assert "\n" not in str(info.value)
    assert file_sha256(cls_job / "export" / "model.onnx") == before
    assert (cls_job / "export" / "model.parity-failed.onnx").is_file()
    assert not json.loads((cls_job / "export" / "export-failed.json").read_text())["parity"]["ok"]
    assert not list((cls_job / "export").glob("*.tmp"))


def test_evaluate_job_with_export(cls_job: Path) -> None:
    record = evaluate_job(cls_job, device="cpu", export=True, fps_runs=3, fps_warmup=1)
    assert record["metrics"] == {"top1": 0.5, "val_loss": 1.0}  # the runtime's validation metrics kept
    assert record["kind"] == "task" and record["primary_metric"] == "top1"
    assert record["fps"]["runtime"] == "torch-cpu" and record["fps"]["runs"] == 3
    assert set(record["fps_all"]) == {"torch-cpu", "onnxruntime-cpu"}
    assert record["fps_all"]["onnxruntime-cpu"]["input_shape"] == [1, 3, 32, 32]
    assert record["export"]["parity_ok"] and record["export"]["file"] == "export/model.onnx"
    assert json.loads((cls_job / "eval.json").read_text())["fps"]["fps"] == record["fps"]["fps"]


def test_user_task_export(tmp_path: Path) -> None:
    job = make_task_job(tmp_path / "run", TINY_USER, steps=1)
    record = export_job(job, parity_inputs=3)
    assert record["inputs"][0]["shape"] == ["batch", 16] and record["parity"]["ok"]


def test_an_evaluated_model_is_exported_without_a_second_load(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet's early export (eval_step): the model evaluate_job loaded (on_loaded) is exported as it is, the
    checkpoint not read again; the entry is eval.json's "export", as export_job's would be."""
    from musubi.evaluate.job_eval import export_evaluated

    job = make_task_job(tmp_path / "run", TINY_USER, steps=1, metrics={"acc": 0.5})
    held: list = []
    evaluate_job(job, device="cpu", fps_runs=2, fps_warmup=0, on_loaded=held.append)
    (loaded,) = held
    assert loaded.job_dir == job and not loaded.model.training and loaded.step == 1
    monkeypatch.setattr(onnx_export, "load_job_model", lambda *a, **k: pytest.fail("the checkpoint read again"))
    entry = export_evaluated(job, loaded)
    assert entry["parity_ok"] and json.loads((job / "eval.json").read_text())["export"] == entry
    record = json.loads((job / "export" / "export.json").read_text())
    assert record["checkpoint"] == str(loaded.checkpoint) and record["sha256"] == entry["sha256"]


def test_export_needs_a_committed_checkpoint(tmp_path: Path) -> None:
    job = make_task_job(tmp_path / "run", TINY_USER, steps=1)
    for marker in (job / "checkpoints").glob("*/COMMITTED"):
        marker.unlink()
    with pytest.raises(ConfigError, match="no committed checkpoint"):
        export_job(job)
    with pytest.raises(ConfigError, match="opset 3"):
        export_job(job, opset=3)


def test_export_refuses_a_foreign_checkpoint(tmp_path: Path) -> None:
    job = make_task_job(tmp_path / "run", TINY_USER, steps=1)
    record = json.loads((job / "job.json").read_text())
    record["config"]["model_args"] = {"hidden": 8}  # job.json edited after training
    (job / "job.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="does not fit the model of job.json"):
        export_job(job)


@pytest.mark.slow
def test_detector_export_parity_and_fps(tmp_path: Path) -> None:
    """A few train-mode passes, then export: the shipped threshold (0.9) keeps no box, so the graph is
    also compared at threshold 0, where every image has 100 scored boxes that must match."""
    job = make_task_job(tmp_path / "run", DETECT, steps=3, metrics={"map50": 0.0, "map": 0.0})
    record = evaluate_job(job, device="cpu", export=True, fps_runs=2, fps_warmup=1)
    export = json.loads((job / "export" / "export.json").read_text())
    assert export["exporter"] == "torchscript" and not export["dynamic_batch"]
    assert export["inputs"][0]["shape"] == [1, 3, "height", "width"]
    parity = export["parity"]
    assert parity["ok"] and parity["torch_detections"] == 0 and "all_scores" in parity
    full = parity["all_scores"]
    assert full["ok"] and full["matched"] == full["torch_detections"] > 0 and full["unmatched"] == 0
    assert full["max_box_diff_px"] < 0.5
    assert record["fps"]["input_shape"] == [1, 3, 128, 128]
    assert set(record["fps_all"]) == {"torch-cpu", "onnxruntime-cpu"}


def test_tensor_comparison() -> None:
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    assert compare_tensors(a, a + 1e-5)["ok"]
    out = compare_tensors(a, a[::-1].copy())
    assert not out["ok"] and out["argmax_agreement"] == 1.0 and out["max_abs_diff"] == 2.0
    assert compare_tensors(a, a[:1])["problem"].startswith("shape")


def test_language_model_export(tmp_path: Path) -> None:
    lm = {"name": "lm-tiny", "task": "lm", "model": "gpt", "model_args": {"layers": 1, "hidden": 32, "heads": 2},
          "data": {"synthetic": {"train_size": 8, "val_size": 4, "seq_len": 16, "vocab": 64}, "workers": 0}}
    job = make_task_job(tmp_path / "run", lm, steps=2, metrics={"val_acc": 0.1, "val_loss": 4.0})
    record = evaluate_job(job, device="cpu", export=True, fps_runs=2, fps_warmup=0)
    export = json.loads((job / "export" / "export.json").read_text())
    assert export["inputs"] == [{"name": "tokens", "shape": ["batch", 16], "dtype": "int64"}]
    assert export["parity"]["ok"] and export["input_info"]["range"] == "[0, 64)"
    assert record["fps"]["input_shape"] == [1, 16] and record["primary_metric"] == "val_acc"


def test_failed_export_does_not_fail_the_evaluation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = make_task_job(tmp_path / "run", TINY_USER, steps=1, metrics={"acc": 0.5})
    monkeypatch.setattr(onnx_export, "compare_tensors",
                        lambda ref, got: {"ok": False, "problem": "forced mismatch"})
    record = evaluate_job(job, device="cpu", export=True, fps_runs=2, fps_warmup=0)
    assert "forced mismatch" in record["export"]["error"]
    assert set(record["fps_all"]) == {"torch-cpu"} and record["fps"]["fps"] > 0


def test_pt_export_loads_into_a_fresh_torchvision_model(cls_job: Path) -> None:
    """`musubi export JOB --format pt`: weights_only-loadable tensors that make a fresh resnet18 answer the same."""
    import torch
    import torchvision
    from typer.testing import CliRunner

    from musubi.cli import app
    from musubi.evaluate.model_io import load_job_model
    from musubi.tasks.weights import load_weights

    res = CliRunner().invoke(app, ["export", str(cls_job), "--format", "pt"])
    assert res.exit_code == 0, res.output
    path = cls_job / "export" / "model.pt"
    record = json.loads((cls_job / "export" / "weights.json").read_text())
    assert record["sha256"] == file_sha256(path) and record["step"] == 2 and record["num_classes"] == 4
    assert record["build"] == "torchvision.models.get_model('resnet18', weights=None, num_classes=4)"
    fresh = torchvision.models.get_model("resnet18", weights=None, num_classes=4)
    fresh.load_state_dict(torch.load(path, weights_only=True), strict=True)
    fresh.eval()
    trained = load_job_model(cls_job).model
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(fresh(x), trained(x))
    load_weights(torchvision.models.get_model("resnet18", weights=None, num_classes=4), path)  # a job's `weights:`
    bad = CliRunner().invoke(app, ["export", str(cls_job), "--format", "safetensors"])
    assert bad.exit_code == 2 and "use onnx or pt" in bad.output
