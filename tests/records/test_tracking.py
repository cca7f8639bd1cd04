"""MLflow tracking: a real two-rank CPU job logs its params and metrics once (rank 0), locally by default."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from musubi.config.job import TrackingSpec
from musubi.contract.errors import ConfigError
from musubi.store.tracking import check_tracking


@pytest.mark.timeout(300)
def test_a_job_logs_to_a_local_mlflow_store(tiny_job, tmp_path: Path, monkeypatch) -> None:
    mlflow = pytest.importorskip("mlflow")  # the `mlflow` extra, installed by `make test`
    from tests.support.runs import train

    job = tiny_job(tracking={"mlflow": True, "mlflow_experiment": "exp-1"})
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "run"), "--no-check")
    assert code == 0, out
    store = tmp_path / "run" / "mlruns"
    assert store.is_dir()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.MlflowClient(tracking_uri=store.resolve().as_uri())
    exp = client.get_experiment_by_name("exp-1")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1  # rank 0 only
    run = runs[0]
    assert run.data.params["name"] == "tiny" and run.data.params["train.batch"]
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert losses and all(m.value == m.value for m in losses)  # finite, one point per log record
    assert (tmp_path / "run" / "tiny" / "mlflow_run_id").read_text() == run.info.run_id


def test_mlflow_asked_for_but_missing_is_a_config_error(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match="MLflow is not installed; pip install 'musubi-train\\[mlflow\\]'"):
        check_tracking(TrackingSpec(mlflow=True))
    check_tracking(TrackingSpec())  # not asked for: nothing to check
