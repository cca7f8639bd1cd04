"""LR scaling with the global batch, warmup and cosine."""

from __future__ import annotations

import math

import pytest

from musubi.config.batch_plan import lr_line, plan_batch, rule_line, scale_lr
from musubi.config.load import job_from_dict
from musubi.contract.errors import ConfigError
from musubi.worker.schedule import lr_factor
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


def test_a_job_without_lr_trains_at_the_default_unscaled_and_says_so() -> None:
    """No lr, base_batch or lr_rule: 0.01 at any global batch (was 0.00125 at 8: 'scaled from 64')."""
    bare = {k: v for k, v in TINY_JOB["train"].items() if k not in ("lr", "base_batch")}
    spec = job_from_dict({**TINY_JOB, "train": {**bare, "batch": 4}})
    assert spec.train.lr_rule == "none" and spec.resolved()["train"]["lr_rule"] == "none"  # job.json says it
    plan = plan_batch(spec, 2)
    assert plan.global_batch == 8 and plan.lr == pytest.approx(0.01)
    assert lr_line(plan.lr, spec.train.lr, spec.train.base_batch, 8, spec.train.lr_rule) == \
        "lr 0.01 (lr_rule none: train.lr as given, not scaled with the global batch 8)"
    assert rule_line(spec, 2) is None  # nothing to announce: the LR written is the LR used
    # base_batch opts into the linear rule: scaled, and the line shows the arithmetic.
    tuned = job_from_dict({**TINY_JOB, "train": {**bare, "batch": 4, "lr": 0.1, "base_batch": 16}})
    assert tuned.train.lr_rule == "linear" and plan_batch(tuned, 2).lr == pytest.approx(0.05)
    assert rule_line(tuned, 2) == "lr 0.05 = 0.1 x 8/16 (linear rule, base_batch 16) for global batch 8"
    assert job_from_dict(spec.resolved()).train.lr_rule == "none"  # the workers read job.json: same rule
    assert job_from_dict(tuned.resolved()).train.lr_rule == "linear"


def test_the_lr_written_is_the_lr_used_unless_a_rule_is_opted_into() -> None:
    """`lr: 1e-3` trained at 5e-4 on a global batch of 32 (linear from a default base_batch 64), silently."""
    bare = {k: v for k, v in TINY_JOB["train"].items() if k not in ("lr", "base_batch")}
    spec = job_from_dict({**TINY_JOB, "train": {**bare, "batch": 16, "lr": 1e-3}})
    assert spec.train.base_batch is None and spec.train.lr_rule == "none"
    assert plan_batch(spec, 2).lr == pytest.approx(1e-3)
    sqrt = job_from_dict({**TINY_JOB, "train": {**bare, "batch": 16, "lr": 0.1, "base_batch": 8, "lr_rule": "sqrt"}})
    assert plan_batch(sqrt, 2).lr == pytest.approx(0.2)
    assert rule_line(sqrt, 2) == "lr 0.2 = 0.1 x sqrt(32/8) (sqrt rule, base_batch 8) for global batch 32"
    auto = job_from_dict({**TINY_JOB, "train": {**bare, "batch": "auto", "lr": 0.1, "base_batch": 64}})
    assert rule_line(auto, 2) == ("lr = 0.1 x G/64 (linear rule, base_batch 64) once the batch probe fixes the "
                                  "global batch G")
    # a rule with nothing to scale from is refused, naming both ways out
    with pytest.raises(ConfigError, match="set train.base_batch.*lr_rule: none"):
        job_from_dict({**TINY_JOB, "train": {**bare, "lr": 0.1, "lr_rule": "linear"}})
    kept = job_from_dict({**TINY_JOB, "train": {**bare, "lr": 0.1, "base_batch": 8, "lr_rule": "none"}})
    assert plan_batch(kept, 2).lr == pytest.approx(0.1)
