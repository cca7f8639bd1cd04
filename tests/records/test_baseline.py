"""Measured speedup: a fleet times a single-GPU (here: single CPU rank) baseline of its distributed job,
caches it per job and machine, and the checklist reports speedup and scaling efficiency."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from musubi.cli import app
from musubi.config.load import load_fleet
from musubi.fleet.baseline import measure_baselines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_fleet_measures_caches_and_judges_its_speedup(tmp_path: Path) -> None:
    data = {
        "name": "sp",
        "defaults": {"task": "classification", "model": "resnet18",
                     "data": {"synthetic": {"train_size": 96, "val_size": 8, "image_size": 32, "num_classes": 4},
                              "workers": 0},
                     "train": {"epochs": 1, "batch": 4, "log_every": 2}},
        "success": {"baseline_steps": 6, "min_scaling_efficiency": 0.01},
        "leaderboard": {"export_top": 0},
        "jobs": [{"name": "dist", "gpus": 2}],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "runs" / "one"
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--device", "cpu", "--cpu-slots", "2",
                                   "--no-check"])
    assert res.exit_code == 0, res.output
    base = json.loads((out / "baselines" / "dist.json").read_text())
    assert base["samples_per_s"] > 0 and base["steps"] == 6 and "cached" not in base
    # The baseline's one rank has what each of the job's ranks has (its slot's cores and threads), not the machine
    threads = [re.search(r"rank 0: (.*?): (\d+) intra-op", (d / "logs" / "rank0.log").read_text())
               for d in (out / "baselines" / "dist" / "dist", out / "dist")]
    assert all(threads) and threads[0].group(2) == threads[1].group(2), [t and t.group(0) for t in threads]
    assert threads[0].group(1) == threads[1].group(1)  # slot 0's cores, as the job's rank 0
    cl = json.loads((out / "checklist.json").read_text())
    fig = cl["figures"]["dist"]
    # The checklist rounds its figures to 3 decimals: compare within that rounding.
    assert fig["speedup"] == pytest.approx(fig["samples_per_s"] / base["samples_per_s"], rel=1e-3, abs=1e-3)
    assert fig["scaling_efficiency"] == pytest.approx(fig["speedup"] / 2, rel=1e-3, abs=1e-3)
    item = next(i for i in cl["items"] if i["check"] == "speedup")
    assert item["status"] == "PASS" and "scaling efficiency on 2" in item["found"]
    # The same job on the same machine: the store's cached baseline, nothing re-run.
    second = tmp_path / "runs" / "two"
    second.mkdir()
    (second / "env.json").write_text((out / "env.json").read_text())
    got = measure_baselines(load_fleet(path), second, [0, 1], "cpu", json.loads((out / "env.json").read_text()),
                            Console(file=open("/dev/null", "w")))  # noqa: SIM115
    assert got["dist"]["cached"] is True and got["dist"]["samples_per_s"] == pytest.approx(base["samples_per_s"])
    assert not (second / "baselines" / "dist").exists()  # no training run this time
