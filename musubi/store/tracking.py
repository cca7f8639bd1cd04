"""MLflow logging of one job (rank 0): params once, every metrics.jsonl record mirrored as metrics.

Local by default: a file store in RUN/mlruns (mlflow-skinny has no SQL backend, and MLflow 3
only keeps the file store when MLFLOW_ALLOW_FILE_STORE is set, which is set for this process
alone). A tracking URI (`tracking.mlflow_uri`) sends it to a server instead. The MLflow run id
is kept in JOB/mlflow_run_id so a restarted or resumed job continues the same MLflow run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from musubi.config.job import TrackingSpec
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES

log = logging.getLogger("musubi")

RUN_ID_FILE = "mlflow_run_id"


def _flat(obj: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = str(obj)[:500]  # MLflow caps param values
    return out


def check_tracking(spec: TrackingSpec) -> None:
    """Before any worker starts: MLflow asked for but not installed is a one-line config error."""
    if not spec.mlflow:
        return
    import importlib.util

    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError("tracking.mlflow: true but MLflow is not installed; pip install 'musubi-train[mlflow]' "
                          "(mlflow-skinny) or set tracking.mlflow: false")


class MlflowSink:
    """One MLflow run for one job."""

    def __init__(self, job_dir: Path, spec: TrackingSpec, job_name: str, config: dict[str, Any]) -> None:
        try:
            import mlflow
        except ImportError:
            raise ConfigError("tracking.mlflow: true but MLflow is not installed; pip install 'musubi-train[mlflow]' "
                              "(mlflow-skinny) or set tracking.mlflow: false") from None
        self._mlflow = mlflow
        uri = spec.mlflow_uri or (job_dir.parent / RUN_FILES.mlruns).resolve().as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(spec.mlflow_experiment or job_dir.parent.name or job_name)
        id_file = job_dir / RUN_ID_FILE
        run_id = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else None
        self._run = mlflow.start_run(run_id=run_id or None, run_name=None if run_id else job_name)
        if run_id is None:
            id_file.write_text(self._run.info.run_id, encoding="utf-8")
            flat = _flat(config)
            keys = sorted(flat)
            for i in range(0, len(keys), 100):  # MLflow takes at most 100 params a call
                mlflow.log_params({k: flat[k] for k in keys[i:i + 100]})
        log.info("MLflow: run %s at %s", self._run.info.run_id, uri)

    def write(self, step: int, values: dict[str, Any], kind: str) -> None:
        metrics = {f"{kind}/{k}": float(v) for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if metrics:
            self._mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        self._mlflow.end_run()
