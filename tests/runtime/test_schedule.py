"""LR scaling with the global batch, warmup and cosine."""

from __future__ import annotations

import math

import pytest

from musubi.config.errors import ConfigError
from musubi.config.load import job_from_dict
from musubi.runtime.batching import plan_batch
from musubi.runtime.schedule import lr_factor, scale_lr
from tests.conftest import TINY_JOB, _merge


def test_lr_rules() -> None:
    assert scale_lr(0.1, 256, 64, "linear") == pytest.approx(0.4)
    assert scale_lr(0.1, 256, 64, "sqrt") == pytest.approx(0.2)
    assert scale_lr(0.1, 256, 64, "none") == pytest.approx(0.1)


def test_warmup_then_cosine() -> None:
    f = lr_factor(4, 104, "cosine")
    assert [f(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == pytest.approx(1.0)
    assert f(54) == pytest.approx(0.5)
    assert f(104) == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(0, 10, "constant")(7) == 1.0
    assert all(0 <= f(i) <= 1 for i in range(200)) and not math.isnan(f(500))


def test_global_batch_plan() -> None:
    spec = job_from_dict(_merge(TINY_JOB, {"train": {"global_batch": 64, "accumulation": 2, "lr": 0.1,
                                                     "base_batch": 32}}))
    plan = plan_batch(spec, 4)
    assert (plan.per_rank, plan.global_batch) == (8, 64)
    assert plan.lr == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="not divisible"):
        plan_batch(spec, 3)
