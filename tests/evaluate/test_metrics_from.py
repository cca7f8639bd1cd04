"""External jobs declare `metrics_from:`; their framework's own files become eval.json (samples: PROVENANCE.md)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from musubi.config.load import load_fleet
from musubi.contract.errors import ConfigError
from musubi.evaluate.adapters import adapt_metrics, fitness_rule
from musubi.evaluate.job_eval import evaluate_job
from musubi.fleet.jobs import command_launch

SAMPLES = Path(__file__).parent / "samples"


def _job_with(tmp_path: Path, sample: str, under: str) -> Path:
    job_dir = tmp_path / "job"
    shutil.copytree(SAMPLES / sample, job_dir / under)
    return job_dir


def test_ultralytics_best_epoch_by_its_fitness(tmp_path: Path) -> None:
    job = _job_with(tmp_path, "ultralytics-8.3", "runs/detect/train")
    out = adapt_metrics(job, "ultralytics")
    # Epoch 5 has the higher mAP50 (0.564), epoch 4 the higher 0.1 mAP50 + 0.9 mAP50-95: best.pt is epoch 4's.
    assert out["source"]["epoch"] == "4" and out["primary_metric"] == "map50"
    assert out["metrics"] == {"map50": 0.55816, "map": 0.31573, "precision": 0.66821, "recall": 0.51937}
    assert out["weights"].endswith("runs/detect/train/weights/best.pt")


def test_ultralytics_padded_columns_of_8_0(tmp_path: Path) -> None:
    out = adapt_metrics(_job_with(tmp_path, "ultralytics-8.0", "r"), "ultralytics", "r")
    assert out["metrics"]["map50"] == 0.4811 and out["source"]["epoch"] == "3" and "weights" not in out


#: Two epochs on which Ultralytics' fitness rules disagree: 0.1 mAP50 + 0.9 mAP50-95 picks epoch 1, mAP50-95 alone
#: (8.3.198 on) epoch 2; epoch 3 is best by neither.
DISAGREE = """epoch,time,train/box_loss,metrics/precision(B),metrics/recall(B),metrics/mAP50(B),metrics/mAP50-95(B),val/box_loss
1,10.0,1.5,0.5,0.5,0.6,0.3,1.4
2,20.0,1.4,0.5,0.5,0.4,0.31,1.3
3,30.0,1.3,0.5,0.5,0.2,0.1,1.2
"""


def _best_pt(path: Path, content: dict) -> None:
    """A checkpoint in the layout Ultralytics saves (torch.save of a dict: a zip holding data.pkl)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(content, path)


@pytest.mark.parametrize(("version", "epoch", "rule"), [
    ("8.3.197", "1", "0.1 mAP50 + 0.9 mAP50-95, the fitness rule of Ultralytics 8.3.197"),
    ("8.3.198", "2", "mAP50-95 alone, the fitness rule of Ultralytics 8.3.198"),
    ("8.4.190", "2", "mAP50-95 alone"),
    ("8.2.103", "1", "0.1 mAP50 + 0.9 mAP50-95"),
])
def test_ultralytics_fitness_rule_of_the_version_that_wrote_best_pt(tmp_path: Path, version: str, epoch: str,
                                                                     rule: str) -> None:
    run = tmp_path / "job" / "runs" / "detect" / "train"
    run.mkdir(parents=True)
    (run / "results.csv").write_text(DISAGREE, encoding="utf-8")
    _best_pt(run / "weights" / "best.pt", {"version": version, "epoch": -1, "model": None})
    out = adapt_metrics(tmp_path / "job", "ultralytics")
    assert out["source"]["epoch"] == epoch and rule in out["source"]["selected"], out["source"]
    assert out["framework"] == {"name": "ultralytics", "version": version}


class Hostile:
    """What a malicious pickle holds: an object whose reading runs a command."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.target}",))


class Model:
    """Stands for Ultralytics' DetectionModel: its attributes, the class names among them, are pickled state."""

    def __init__(self) -> None:
        self.names = {0: "person", 1: "boat"}


def test_ultralytics_row_of_best_pt_itself_and_its_names(tmp_path: Path) -> None:
    """best.pt's own train_metrics name its epoch (3 here, a row no fitness rule picks), and its model's names
    become the class names; nothing of the pickle runs (an object that would run a command is inert)."""
    run = tmp_path / "job" / "r"
    run.mkdir(parents=True)
    (run / "results.csv").write_text(DISAGREE, encoding="utf-8")
    _best_pt(run / "weights" / "best.pt", {
        "version": "8.4.190", "model": Model(), "hostile": Hostile(tmp_path / "ran"),
        "train_metrics": {"metrics/mAP50(B)": 0.2, "metrics/mAP50-95(B)": 0.1, "fitness": 0.1},
        "train_args": {"imgsz": 320, "data": "data.yaml", "task": "detect"}})
    out = adapt_metrics(tmp_path / "job", "ultralytics")
    assert out["source"]["epoch"] == "3" and out["source"]["selected"].startswith("the epoch best.pt was saved at")
    assert out["classes"] == ["person", "boat"] and out["input_size"] == 320
    assert not (tmp_path / "ran").exists()
    assert fitness_rule(None, padded=True)[1].endswith("version unknown, padded columns: before 8.1")


def test_metrics_named_by_the_framework_or_musubi(tmp_path: Path) -> None:
    job = _job_with(tmp_path, "ultralytics-8.3", "runs/detect/train")
    out = adapt_metrics(job, "ultralytics", rename={"map50": "metrics/mAP50(B)", "box": "val/box_loss",
                                                    "map": "map"})
    assert out["metrics"] == {"map50": 0.55816, "box": 1.52178, "map": 0.31573} and out["primary_metric"] == "map50"
    hf = _job_with(tmp_path / "hf", "hf-trainer-5.24", "out")
    assert adapt_metrics(hf, "hf-trainer", rename={"top1": "accuracy"})["metrics"] == {"top1": 0.65625}
    assert adapt_metrics(hf, "hf-trainer", rename={"top1": "eval_accuracy"})["metrics"] == {"top1": 0.65625}
    with pytest.raises(ConfigError, match=r"no metric 'mAP50' \(has lr/pg0, .*metrics/mAP50\(B\).*\); fix "
                                          "metrics_from.metrics to name one of them"):
        adapt_metrics(job, "ultralytics", rename={"map50": "mAP50"})


def test_hf_trainer_final_state_not_the_last_checkpoint(tmp_path: Path) -> None:
    """Transformers 5.24 (samples/hf-trainer-5.24, a real run): checkpoint-24 is saved at the last step but before
    the final evaluation (step 24, accuracy 0.656); only the state trainer.save_state() wrote holds it."""
    job = _job_with(tmp_path, "hf-trainer-5.24", "out")
    out = adapt_metrics(job, "hf-trainer")
    assert out["metrics"]["eval_accuracy"] == 0.65625 and out["source"]["step"] == 24
    assert out["source"]["file"].endswith("out/trainer_state.json") and "note" not in out["source"]
    (job / "out" / "trainer_state.json").unlink()  # a script that never called save_state()
    out = adapt_metrics(job, "hf-trainer")
    assert out["source"]["file"].endswith("checkpoint-24/trainer_state.json"), out["source"]
    assert out["metrics"]["eval_accuracy"] == 0.625 and "call trainer.save_state()" in out["source"]["note"]
    # trainer.save_metrics("eval", ...) after the last checkpoint: the run's last evaluation
    (job / "out" / "eval_results.json").write_text(json.dumps({"eval_accuracy": 0.7, "eval_loss": 0.6,
                                                               "epoch": 3.0}), encoding="utf-8")
    out = adapt_metrics(job, "hf-trainer")
    assert out["metrics"] == {"eval_accuracy": 0.7, "eval_loss": 0.6} and "eval_results.json" in \
        out["source"]["selected"]


def test_lightning_last_logged_values_renamed(tmp_path: Path) -> None:
    job = _job_with(tmp_path, "lightning", "logs/lightning_logs/version_0")
    out = adapt_metrics(job, "lightning", rename={"map50": "val_map50", "val_loss": "val_loss"})
    assert out["metrics"] == {"map50": pytest.approx(0.447), "val_loss": pytest.approx(0.80213, abs=1e-5)}
    assert out["primary_metric"] == "map50" and out["source"]["epoch"] == "1"


def test_hf_trainer_last_evaluation(tmp_path: Path) -> None:
    out = adapt_metrics(_job_with(tmp_path, "hf-trainer", "out"), "hf-trainer")
    assert out["metrics"] == {"eval_accuracy": 0.7984, "eval_loss": pytest.approx(0.5631, abs=1e-4)}
    assert out["source"]["step"] == 500 and out["weights"] == "out/checkpoint-250"


@pytest.mark.parametrize(("fmt", "write", "says"), [
    ("ultralytics", None, "no results.csv under it (metrics_from: ultralytics); set metrics_from.path"),
    ("ultralytics", "epoch,time,train/box_loss\n1,2.0,1.5\n", "no column metrics/mAP50(B)"),
    ("ultralytics", "", "empty; the run wrote no epoch yet"),
    ("lightning", "epoch,step,val_map50\n0,9,\n", "no metric was logged"),
    ("lightning", "epoch,step,val_map50\n0,9,nan\n", "line 2 val_map50 is 'nan'; the run diverged"),
    ("hf-trainer", "{\"log_history\": [{\"loss\": 1.0, \"step\": 5}]}", "log_history holds no evaluation"),
    ("hf-trainer", "{not json", "not valid JSON"),
])
def test_bad_or_missing_files_are_one_line_errors(tmp_path: Path, fmt: str, write: str | None, says: str) -> None:
    job = tmp_path / "job"
    job.mkdir()
    if write is not None:
        name = {"ultralytics": "results.csv", "lightning": "metrics.csv", "hf-trainer": "trainer_state.json"}[fmt]
        (job / name).write_text(write, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        adapt_metrics(job, fmt)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_declared_adapter_feeds_the_evaluation_step(tmp_path: Path) -> None:
    """The fleet records metrics_from at launch; the evaluation step writes eval.json from the run's files."""
    (tmp_path / "train.py").write_text("print('trained')\n", encoding="utf-8")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"""name: f
jobs:
  - name: yolo
    command: [train.py]
    python: {sys.executable}
    metrics_from: ultralytics
  - name: lit
    command: [train.py]
    python: {sys.executable}
    metrics_from: {{format: lightning, path: logs, metrics: {{map50: val_map50}}}}
""", encoding="utf-8")
    spec = load_fleet(fleet)
    run = tmp_path / "run"
    for job, sample, under in ((spec.jobs[0], "ultralytics-8.3", "runs/detect/train"),
                               (spec.jobs[1], "lightning", "logs/lightning_logs/version_0")):
        command_launch(job, run, [0], "cpu", tmp_path)
        shutil.copytree(SAMPLES / sample, run / job.name / under)
        record = evaluate_job(run / job.name, device="cpu")
        assert record["kind"] == "external" and record["metrics"]["map50"] > 0.4
        if job.name == "yolo":  # its best.pt (a placeholder) is exported in the job's Python, which has no Ultralytics
            assert record["fps_missing"].startswith("no model to time: Ultralytics' export of ")
            assert "No module named 'ultralytics'" in record["fps_missing"]
            assert "framework-export.log" in record["fps_missing"]
        else:
            assert record["fps_missing"].startswith("the external program reported no fps")
    with pytest.raises(ConfigError, match="metrics_from: unknown|format: Input should be"):
        fleet.write_text(fleet.read_text().replace("metrics_from: ultralytics", "metrics_from: yolo"))
        load_fleet(fleet)
