"""The fleet's early export in its tail: the decision rule, ship() reusing an export of the newest checkpoint, and
a tiny CPU fleet whose job exports during its evaluation while another job still runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from musubi.cli import app
from musubi.config.errors import ConfigError
from musubi.config.load import load_fleet
from musubi.fleet import local
from musubi.fleet.local import EARLY_EXPORT_MARGIN_S, early_export
from musubi.fleet.ship import exported_current, ship
from musubi.store.rundir import write_json


def test_the_rule_exports_beside_a_long_job_only() -> None:
    long = EARLY_EXPORT_MARGIN_S + 30.0
    assert early_export(1, 0, {"resnet50": long, "mlp": 2.0}) == "resnet50"  # the longest other job is named
    assert early_export(1, 0, {}) is None  # the last job to end: its export could lengthen the fleet
    assert early_export(1, 0, {"mlp": EARLY_EXPORT_MARGIN_S - 1}) is None  # the other job ends too soon
    assert early_export(1, 0, {"overdue": -5.0}) is None  # past its prediction: it may end any moment
    assert early_export(1, 1, {"resnet50": long}) is None  # a job waits for the freed GPUs: it goes first
    assert early_export(0, 0, {"resnet50": long}) is None  # the fleet exports nothing


def test_a_parity_failure_is_a_recorded_export_error() -> None:
    from musubi.evaluate.onnx_export import ParityError

    # evaluate_task_job records a ConfigError of the export as {"export": {"error": ...}} and carries on.
    assert issubclass(ParityError, ConfigError)


def _checkpoint(root: Path, step: int) -> Path:
    """A committed checkpoint folder (marker with sizes and SHA-256), as latest_checkpoint reads it."""
    d = root / f"step-{step:09d}"
    d.mkdir(parents=True)
    data = bytes([step]) * 8
    (d / "weights.distcp").write_bytes(data)
    (d / "COMMITTED").write_text(json.dumps({"step": step, "files": {"weights.distcp": len(data)},
                                             "sha256": {"weights.distcp": hashlib.sha256(data).hexdigest()}}))
    return d


def test_ship_reuses_an_export_of_the_newest_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import musubi.evaluate.onnx_export as onnx_export
    import musubi.store.registry as registry

    run = tmp_path / "run"
    job = run / "cls"
    older, newest = _checkpoint(job / "checkpoints", 1), _checkpoint(job / "checkpoints", 2)
    write_json(job / "job.json", {"config": {"name": "cls", "task": "classification", "model": "resnet18"},
                                  "status": "done"})
    # As the evaluation step writes it after an export.
    write_json(job / "eval.json", {"metrics": {"top1": 0.5}, "primary_metric": "top1", "fps": {"fps": 50.0},
                                   "kind": "task", "export": {"file": "export/model.onnx",
                                                              "record": "export/export.json"}})
    (job / "export").mkdir()
    (job / "export" / "model.onnx").write_bytes(b"graph")
    exports: list[Path] = []
    monkeypatch.setattr(onnx_export, "export_job", lambda d: exports.append(d))
    monkeypatch.setattr(registry, "register", lambda d: {"name": d.name, "version": 1})
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "f", "leaderboard": {"export_top": 1, "promote": False},
                                     "jobs": [{"name": "cls", "task": "classification", "model": "resnet18",
                                               "data": {"synthetic": {"train_size": 16}}}]}))
    spec = load_fleet(fleet)
    console = Console(width=160, file=open(tmp_path / "out.txt", "w"))  # noqa: SIM115
    for named, reused in ((newest, True), (older, False), (job / "checkpoints" / "step-000000009", False)):
        write_json(job / "export" / "export.json", {"checkpoint": str(named), "parity": {"ok": True}})
        assert exported_current(job) is reused
        exports.clear()
        shipped = ship(spec, run, console)
        assert (shipped.early, exports) == ((["cls"], []) if reused else ([], [job])), named
    write_json(job / "export" / "export.json", {"checkpoint": str(newest), "parity": {"ok": True}})
    (job / "export" / "model.onnx").unlink()  # a record without its graph is no export
    assert not exported_current(job)
    (job / "export" / "model.onnx").write_bytes(b"graph")
    write_json(job / "eval.json", {"metrics": {"top1": 0.5}, "export": {"error": "export: parity"}})
    assert not exported_current(job)  # the early export failed: ship() exports itself


EXTERNAL = '''
import json, os, pathlib, time
d = pathlib.Path(os.environ["MUSUBI_JOB_DIR"])
# Runs until the task job beside it has exported its model in its evaluation step (or 120 s pass).
record = d.parent / "r18" / "export" / "export.json"
deadline = time.time() + 120
while not record.is_file() and time.time() < deadline:
    time.sleep(0.2)
(d / "eval.json").write_text(json.dumps({"metrics": {"top1": 0.1}, "primary_metric": "top1"}))
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fleet_exports_early_and_ships_without_a_second_export(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Jobs of seconds: any job still training counts as long enough (the rule itself is tested above).
    monkeypatch.setattr(local, "EARLY_EXPORT_MARGIN_S", -1e9)
    (tmp_path / "ext.py").write_text(EXTERNAL)
    data = {"name": "tail", "leaderboard": {"export_top": 1, "promote": False},
            "defaults": {"task": "classification", "model": "resnet18",
                         "data": {"synthetic": {"train_size": 16, "val_size": 8, "image_size": 32,
                                                "num_classes": 4}, "workers": 0},
                         "train": {"max_steps": 2, "batch": 8, "log_every": 1}},
            "jobs": [{"name": "r18"}, {"name": "ext", "command": ["ext.py"]}]}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    # CPU slots: machine.overlap is off, so the evaluation step starts after training and reads the decision
    # from the trained marker at once (the path GPUs take, pre-started, reads it after its wait).
    res = CliRunner().invoke(app, ["run", str(fleet), "--out", str(out), "--device", "cpu", "--cpu-slots", "2"])
    assert res.exit_code == 0, res.output
    rec = json.loads((out / "fleet.json").read_text())
    r18 = rec["jobs"]["r18"]
    assert r18["early_export"] == "ext" and r18["history"][-1]["early_export"], r18
    assert rec["jobs"]["ext"]["early_export"] == "" and isinstance(rec["ship_s"], float)
    assert json.loads((out / "r18" / "logs" / "trained.json").read_text())["export"] is True
    assert "export r18 early (tail; ext still trains" in res.output, res.output
    # Exported once, in the evaluation step (before its FPS was measured), and registered as it was.
    export = json.loads((out / "r18" / "export" / "export.json").read_text())
    evaluated = json.loads((out / "r18" / "eval.json").read_text())
    assert export["created"] < evaluated["evaluated"] and evaluated["export"]["parity_ok"], (export, evaluated)
    assert "registered (exported early) r18" in res.output and "export done early for: r18" in res.output
    assert "export done early for: r18" in (out / "fleet.log").read_text()
