"""The duration model: history first (with fitted scaling), then the probe, the declaration, the fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from musubi.config.load import load_fleet
from musubi.fleet.durations import (
    DEFAULT_STARTUP_S,
    FALLBACK_S,
    estimate,
    fit_comm,
    job_key,
    seconds_on,
    slowdown,
)
from musubi.store.db import store_baseline, store_job_run

FLEET = """
name: durations
jobs:
  - name: cls
    task: classification
    model: resnet18
    data: {synthetic: {train_size: 1000, image_size: 32, num_classes: 4}}
    train: {batch: 10, epochs: 2}
    gpus: 1
    max_gpus: 4
  - name: steps
    task: classification
    model: resnet18
    data: {synthetic: {train_size: 1000, image_size: 32, num_classes: 4}}
    train: {batch: 10, max_steps: 50}
  - name: ext
    command: [ext.py]
    expected_min: 2
"""
MACHINE = ["box", ["NVIDIA H200"]]


@pytest.fixture
def fleet(tmp_path: Path):
    (tmp_path / "ext.py").write_text("print('hi')\n")
    (tmp_path / "fleet.yaml").write_text(FLEET)
    return {j.name: j for j in load_fleet(tmp_path / "fleet.yaml").jobs}


def test_amdahl_scaling_and_fit_from_two_widths() -> None:
    assert slowdown(1, 0.3) == 1.0 and slowdown(2, 0.1) == pytest.approx(1.1)
    one, s, c = 400.0, 20.0, 0.08
    runs = [{"width": w, "seconds": seconds_on(w, one, s, c, True), "startup_s": s} for w in (4, 1)]
    assert fit_comm(runs, True) == pytest.approx(c)
    assert fit_comm(runs[:1], True) is None


def test_sources_in_order(fleet, tmp_path: Path) -> None:
    db = tmp_path / "musubi.db"
    cls, steps, ext = fleet["cls"], fleet["steps"], fleet["ext"]
    # nothing known: 2000 samples at the fallback rate; more GPUs shorten an epochs job, not a max_steps one
    e = estimate(cls, (1, 2, 4), db, MACHINE, "cuda")
    assert e.source == "fallback" and e.at(4) < e.at(2) < e.at(1)
    assert e.at(1) == pytest.approx(DEFAULT_STARTUP_S["cuda"] + 2000 / 500.0)
    s = estimate(steps, (1, 2), db, MACHINE, "cuda")
    assert s.at(2) > s.at(1)
    assert estimate(ext, (1,), db, MACHINE, "cuda").at(1) == pytest.approx(120.0)  # expected_min: 2
    assert estimate(ext.model_copy(update={"expected_min": None}), (1,), db, MACHINE, "cpu").at(1) == \
        pytest.approx(FALLBACK_S["cpu"])
    # a measured single-GPU baseline (the probe) of this config on this machine
    import json

    store_baseline(db, json.dumps({"config": json.loads(json.dumps(cls.spec.resolved(), default=str)),
                                   "machine": MACHINE, "steps": 20, "torch": "x"}), 100.0, {})
    e = estimate(cls, (1, 2), db, MACHINE, "cuda")
    assert e.source == "probe" and e.at(1) == pytest.approx(DEFAULT_STARTUP_S["cuda"] + 2000 / 100.0)
    # history wins; another machine's history is not this job's
    store_job_run(db, job_key(cls, MACHINE, "cuda"), 2, 70.0, 10.0, {})
    store_job_run(db, job_key(cls, ["other", []], "cuda"), 1, 5.0, 1.0, {})
    e = estimate(cls, (1, 2, 4), db, MACHINE, "cuda")
    assert e.source == "history (1 run)" and e.at(2) == pytest.approx(70.0) and e.startup_s == 10.0
    store_job_run(db, job_key(cls, MACHINE, "cuda"), 1, 110.0, 10.0, {})
    e = estimate(cls, (1, 2, 4), db, MACHINE, "cuda")
    assert e.source == "history (2 runs)" and e.at(1) == pytest.approx(110.0) and e.at(2) == pytest.approx(70.0)
    assert e.comm == pytest.approx(0.2)  # 100 s on one GPU, 60 s on two: 1 + c = 1.2


def test_moldable_fields_are_checked(tmp_path: Path) -> None:
    bad = FLEET.replace("    gpus: 1\n    max_gpus: 4", "    gpus: 3\n    max_gpus: 2")
    (tmp_path / "ext.py").write_text("")
    (tmp_path / "fleet.yaml").write_text(bad)
    with pytest.raises((ValidationError, Exception), match="between min_gpus"):
        load_fleet(tmp_path / "fleet.yaml")
    (tmp_path / "fleet.yaml").write_text(FLEET.replace("    expected_min: 2", "    max_gpus: 2"))
    with pytest.raises((ValidationError, Exception), match="only task jobs are moldable"):
        load_fleet(tmp_path / "fleet.yaml")
