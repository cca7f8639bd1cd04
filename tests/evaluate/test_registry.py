"""Model registry round trip: register, version, list, promote, manifest, tamper checks, rebuild."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.contract.errors import ConfigError
from musubi.evaluate import evaluate_job, export_job
from musubi.evaluate.registry import (
    MANIFEST_FORMAT,
    file_sha256,
    get_model,
    list_models,
    promote,
    rebuild_registry,
    register,
    write_manifest,
)
from musubi.store.rundir import write_json
from tests.evaluate.jobs import TINY_USER, make_task_job, tiny_onnx


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """runs/r1 with an exported task job (tiny MLP) and an external job with its own model.onnx."""
    run = tmp_path / "runs" / "r1"
    job = make_task_job(run, TINY_USER, steps=1, metrics={"acc": 0.75})
    evaluate_job(job, device="cpu", export=True, fps_runs=2, fps_warmup=0)
    write_json(run / "env.json", {"host": "h1", "torch": "2.x", "gpus": [{"name": "H100"}]})
    ext = run / "ext"
    tiny_onnx(ext / "model.onnx")
    write_json(ext / "eval.json", {"metrics": {"map50": 0.4}, "fps": {"fps": 55.0}, "dataset_hash": "coco-v3"})
    return tmp_path / "runs"


def test_round_trip(runs: Path) -> None:
    job = runs / "r1" / "mlp-tiny"
    entry = register(job)
    assert (entry["name"], entry["version"], entry["promoted"]) == ("mlp-tiny", 1, False)
    assert entry["files"][0]["sha256"] == file_sha256(job / "export" / "model.onnx")
    assert entry["files"][1]["role"] == "export-record"
    assert entry["metrics"] == {"acc": 0.75} and entry["primary_metric"] == "acc"
    assert entry["dataset_hash"].startswith("synthetic-")
    assert entry["env"]["host"] == "h1" and entry["run_dir"] == str((runs / "r1").resolve())
    assert entry["fps"]["runtime"] == "torch-cpu"
    assert entry["input"]["inputs"][0]["shape"] == ["batch", 16]
    assert register(job) == entry  # the same file again: the same version
    ext = register(runs / "r1" / "ext", name="mlp-tiny")  # another job under the same name: next version
    assert ext["version"] == 2 and ext["dataset_hash"] == "coco-v3" and ext["input"]["task"] == "external"
    assert ext["input"]["inputs"] == [{"name": "x", "shape": ["batch", 4], "dtype": "float32"}]
    db = runs / "musubi.db"
    assert [(e["name"], e["version"]) for e in list_models(db=db)] == [("mlp-tiny", 1), ("mlp-tiny", 2)]

    assert promote("mlp-tiny", 1, db=db)["promoted"]
    promote("mlp-tiny", 2, db=db)  # one deployable version a name: v1 is demoted
    assert [e["promoted"] for e in list_models(db=db, name="mlp-tiny")] == [False, True]
    marker = json.loads((runs / "r1" / "mlp-tiny" / "export" / "registered.json").read_text())
    assert marker == {**marker, "name": "mlp-tiny", "version": 1, "promoted": False}

    out = runs / "deploy" / "manifest.json"
    data = write_manifest(out, db=db)
    assert json.loads(out.read_text()) == data
    assert data["format"] == MANIFEST_FORMAT and [m["version"] for m in data["models"]] == [2]
    model = data["models"][0]
    assert model["files"][0]["relpath"] == "../r1/ext/model.onnx"
    assert model["files"][0]["sha256"] == file_sha256(runs / "r1" / "ext" / "model.onnx")
    assert model["fps"]["fps"] == 55.0 and model["trained_on"]["gpus"] == ["H100"]
    assert model["input"]["inputs"][0]["name"] == "x"


def test_fleet_style_calls(runs: Path) -> None:
    """The fleet's ship step: register(job), promote(..., run_dir=RUN), write_manifest(RUN/manifest.json, run_dir=RUN)."""
    run = runs / "r1"
    entry = register(run / "mlp-tiny")
    promote(entry["name"], entry["version"], db=None, run_dir=run)
    data = write_manifest(run / "manifest.json", run_dir=run)
    assert [m["name"] for m in data["models"]] == ["mlp-tiny"]
    assert data["models"][0]["files"][0]["relpath"] == "mlp-tiny/export/model.onnx"
    assert data["models"][0]["input"]["info"]["normalisation"] == "as the task's data set produces it"


def test_tampered_file_is_refused(runs: Path) -> None:
    entry = register(runs / "r1" / "ext")
    (runs / "r1" / "ext" / "model.onnx").write_bytes(b"swapped")
    with pytest.raises(ConfigError, match="changed since ext v1 was registered"):
        promote("ext", entry["version"], db=runs / "musubi.db")


def test_unknown_versions_and_missing_files(runs: Path, tmp_path: Path) -> None:
    register(runs / "r1" / "ext")
    with pytest.raises(ConfigError, match=r"no model 'ext' version 7 \(versions of 'ext': 1\)"):
        get_model("ext", 7, db=runs / "musubi.db")
    with pytest.raises(ConfigError, match="no model 'nope' version 1"):
        promote("nope", 1, db=runs / "musubi.db")
    empty = tmp_path / "runs" / "r1" / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="run `musubi export"):
        register(empty)


def test_failed_parity_is_not_registered(runs: Path) -> None:
    record = runs / "r1" / "mlp-tiny" / "export" / "export.json"
    data = json.loads(record.read_text())
    data["parity"] = {"ok": False, "problem": "shape [1] != torch's [2]"}
    record.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="parity check failed"):
        register(runs / "r1" / "mlp-tiny")


def test_rebuild_from_run_directories(runs: Path) -> None:
    db = runs / "musubi.db"
    register(runs / "r1" / "mlp-tiny")
    register(runs / "r1" / "ext")
    promote("ext", 1, db=db)
    before = {(e["name"], e["version"], e["promoted"], e["files"][0]["sha256"]) for e in list_models(db=db)}
    db.unlink()
    assert rebuild_registry(runs) == 2
    after = {(e["name"], e["version"], e["promoted"], e["files"][0]["sha256"]) for e in list_models(db=db)}
    assert after == before


def test_reexport_makes_a_new_version(runs: Path) -> None:
    job = runs / "r1" / "mlp-tiny"
    assert register(job)["version"] == 1
    export_job(job, opset=16)  # a different file of the same job
    second = register(job)
    assert second["version"] == 2 and second["input"]["opset"] == 16


def test_dataset_version_is_the_one_recorded_when_the_run_started(runs: Path) -> None:
    # env.json holds what each job trained on (musubi.data.version); the data may have changed since.
    write_json(runs / "r1" / "env.json", {"host": "h1", "datasets": {"mlp-tiny": "data-0123456789abcdef-abc123"}})
    assert register(runs / "r1" / "mlp-tiny")["dataset_hash"] == "data-0123456789abcdef-abc123"


def test_deleted_run_is_skipped_with_a_warning_demote_and_supersede(runs: Path) -> None:
    import shutil

    from typer.testing import CliRunner

    from musubi.cli import app

    db = runs / "musubi.db"
    old = register(runs / "r1" / "mlp-tiny")
    promote(old["name"], old["version"], run_dir=runs / "r1")  # an earlier fleet's auto-promotion
    first = register(runs / "r1" / "ext", name="det")
    promote("det", first["version"], db=db)
    r2 = runs / "r2"
    shutil.copytree(runs / "r1" / "ext", r2 / "ext")
    (r2 / "ext" / "export" / "registered.json").unlink()
    newer = register(r2 / "ext", name="det")  # a later fleet promotes the same model name
    promote("det", newer["version"], run_dir=r2)
    assert [(e["version"], e["promoted"]) for e in list_models(db=db, name="det")] == [(1, False), (2, True)]
    shutil.rmtree(runs / "r1")  # the old run is deleted; its promoted model stays in the registry
    data = write_manifest(r2 / "manifest.json", run_dir=r2)  # a later fleet's manifest still works
    assert [(m["name"], m["version"]) for m in data["models"]] == [("det", 2)]
    assert len(data["skipped"]) == 1 and "mlp-tiny v1" in data["skipped"][0]
    assert "r1/mlp-tiny/export/model.onnx" in data["skipped"][0]
    assert "musubi registry demote mlp-tiny:1" in data["skipped"][0]
    cli = CliRunner()
    res = cli.invoke(app, ["registry", "manifest", "--db", str(db)])
    assert res.exit_code == 0 and "warning: mlp-tiny v1 left out" in res.output, res.output
    res = cli.invoke(app, ["registry", "demote", "mlp-tiny:1", "--db", str(db)])
    assert res.exit_code == 0 and "demoted mlp-tiny v1" in res.output, res.output
    assert json.loads((runs / "manifest.json").read_text())["skipped"] == []
    res = cli.invoke(app, ["registry", "demote", "mlp-tiny", "--db", str(db)])
    assert res.exit_code == 2 and "not promoted" in res.output
    res = cli.invoke(app, ["registry", "demote", "det", "--db", str(db)])
    assert res.exit_code == 0 and not any(e["promoted"] for e in list_models(db=db))


@pytest.mark.parametrize("auto", [True, False])
def test_fleet_promotion_can_be_turned_off(tmp_path: Path, auto: bool) -> None:
    import yaml
    from rich.console import Console

    from musubi.config.load import load_fleet
    from musubi.fleet.ship import ship

    run = tmp_path / "runs" / "r3"
    tiny_onnx(run / "ext" / "model.onnx")
    write_json(run / "ext" / "eval.json", {"metrics": {"map50": 0.4}, "primary_metric": "map50",
                                           "fps": {"fps": 55.0}})
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "p", "leaderboard": {"promote": auto},
                                     "jobs": [{"name": "ext", "command": ["true"]}]}))
    ship(load_fleet(fleet), run, Console(width=160, file=open(tmp_path / "out.txt", "w")))  # noqa: SIM115
    assert [(e["name"], e["promoted"]) for e in list_models(run_dir=run)] == [("ext", auto)]
    assert len(json.loads((run / "manifest.json").read_text())["models"]) == int(auto)
