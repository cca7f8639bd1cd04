"""External jobs declare `metrics_from:`; their framework's own files become eval.json (samples: PROVENANCE.md)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from musubi.config.load import load_fleet
from musubi.contract.errors import ConfigError
from musubi.evaluate.adapters import adapt_metrics
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
        assert record["fps_missing"].startswith("the external program reported no fps")
    with pytest.raises(ConfigError, match="metrics_from: unknown|format: Input should be"):
        fleet.write_text(fleet.read_text().replace("metrics_from: ultralytics", "metrics_from: yolo"))
        load_fleet(fleet)
