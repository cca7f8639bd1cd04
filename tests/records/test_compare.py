"""`musubi compare`: exactly what changed between two runs, and a flagged throughput drop."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from typer.testing import CliRunner

from musubi.cli import app
from musubi.records.compare import compare_runs, diff

ENV = {"host": "h", "torch": "2.11.0", "packages": {"torch": "2.11.0", "numpy": "2.1.0"},
       "gpus": [{"index": 0, "name": "H200", "uuid": "GPU-a"}], "env": {"NCCL_NVLS_ENABLE": "0"}}
CONFIG = {"name": "a", "task": "lm", "model": "gpt", "data": {"synthetic": {"seq_len": 32}},
          "train": {"batch": 8, "lr": 0.001}}


def _run(root: Path, env: dict, config: dict, rate: float, gpus=(0, 1)) -> Path:
    run = root
    (run / "a").mkdir(parents=True)
    (run / "env.json").write_text(json.dumps(env))
    (run / "run.json").write_text(json.dumps({"config": {"name": "f", "leaderboard": {"export_top": 1}}}))
    (run / "fleet.json").write_text(json.dumps({"jobs": {"a": {"kind": "task", "state": "done", "gpus": list(gpus)}}}))
    (run / "a" / "job.json").write_text(json.dumps({"config": config, "status": "done", "nproc": 2}))
    recs = [{"kind": "train", "step": i, "loss": 1.0, "samples_per_s": rate, "mem_peak_allocated_gib": 3.0}
            for i in range(4)]
    (run / "a" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    (run / "a" / "eval.json").write_text(json.dumps({"metrics": {"val_acc": 0.5}}))
    return run


def test_one_package_and_one_config_value_are_exactly_what_changed(tmp_path: Path) -> None:
    env_b = copy.deepcopy(ENV)
    env_b["packages"]["numpy"] = "2.2.0"
    cfg_b = copy.deepcopy(CONFIG)
    cfg_b["train"]["lr"] = 0.002
    a = _run(tmp_path / "a", ENV, CONFIG, 100.0)
    b = _run(tmp_path / "b", env_b, cfg_b, 99.0)
    rep = compare_runs(a, b)
    assert rep["env_changes"] == [{"key": "packages.numpy", "a": "2.1.0", "b": "2.2.0"}]
    assert rep["jobs"]["a"]["config_changes"] == [{"key": "train.lr", "a": 0.001, "b": 0.002}]
    assert rep["config_changes"] == [] and rep["regressions"] == [] and rep["jobs"]["a"]["placement"] is None
    assert rep["jobs"]["a"]["data"] is None  # synthetic spec unchanged: same dataset version


def test_a_ten_percent_throughput_drop_is_flagged(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", ENV, CONFIG, 100.0)
    b = _run(tmp_path / "b", ENV, CONFIG, 89.0, gpus=(2, 3))
    rep = compare_runs(a, b)
    assert rep["regressions"] == ["a: throughput -11.0% (100.0 -> 89.0 samples/s)"]
    assert rep["jobs"]["a"]["placement"] == {"a": [0, 1], "b": [2, 3]}
    res = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 0 and "REGRESSION a: throughput -11.0%" in res.output
    out = json.loads(CliRunner().invoke(app, ["compare", str(a), str(b), "--json"]).output)
    assert out["jobs"]["a"]["throughput_change"] < -0.1
    assert compare_runs(a, b, regression=0.2)["regressions"] == []


def test_comparing_something_that_is_not_a_run_exits_2(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", ENV, CONFIG, 100.0)
    res = CliRunner().invoke(app, ["compare", str(a), str(tmp_path / "missing")])
    assert res.exit_code == 2 and "not a run directory" in res.output


def test_diff_of_lists_of_gpus_is_by_index() -> None:
    a = {"gpus": [{"index": 0, "uuid": "x"}, {"index": 1, "uuid": "y"}]}
    b = {"gpus": [{"index": 0, "uuid": "x"}, {"index": 1, "uuid": "z"}]}
    assert diff(a, b) == [{"key": "gpus.1.uuid", "a": "y", "b": "z"}]


def test_compare_stays_legible_at_80_columns(tmp_path: Path) -> None:
    """Piped or in an 80-column terminal: every header and figure whole, no line wider than 80."""
    import io

    from rich.console import Console

    from musubi.records.compare import render

    a = _run(tmp_path / "a", ENV, CONFIG, 100.0)
    b = _run(tmp_path / "b", ENV, CONFIG, 89.0)
    buf = io.StringIO()
    render(compare_runs(a, b), Console(file=buf, width=80))
    out = buf.getvalue()
    assert all(len(line) <= 80 for line in out.splitlines())
    for word in ("samples/s", "peak GiB", "B vs A", "100.0", "89.0", "-11.0%", "val_acc"):
        assert word in out, out
