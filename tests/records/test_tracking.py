"""MLflow tracking: asked for but missing, and its settings. A real two-rank CPU job logging its params and metrics
once (rank 0), locally by default, is asserted on the launch of
tests/records/test_checklist.py::test_musubi_train_ends_with_its_checklist (one launch for both)."""

from __future__ import annotations

import importlib.util

import pytest

from musubi.config.job import TrackingSpec
from musubi.contract.errors import ConfigError
from musubi.store.tracking import check_tracking


def test_mlflow_asked_for_but_missing_is_a_config_error(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match="MLflow is not installed; pip install 'musubi-train\\[mlflow\\]'"):
        check_tracking(TrackingSpec(mlflow=True))
    check_tracking(TrackingSpec())  # not asked for: nothing to check
