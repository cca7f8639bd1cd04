"""ship() and the checklist say who won each leaderboard table and what was shipped; an external job without a
model.onnx is nothing to ship, not a failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from musubi.config.load import load_fleet
from musubi.fleet.ship import ship
from musubi.store.rundir import write_json
from tests.evaluate.runs import external_job, task_job


def _spec(tmp_path: Path) -> Any:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "f", "leaderboard": {"export_top": 1, "promote": False},
                                     "jobs": [{"name": "x", "command": ["true"]}]}))
    return load_fleet(fleet)


def _ship(tmp_path: Path, run: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Path], str]:
    from musubi.evaluate import onnx_export, registry

    exported: list[Path] = []

    def register(d: Path) -> dict[str, Any]:
        write_json(d / "export" / "registered.json", {"name": d.name, "version": 1})
        return {"name": d.name, "version": 1}

    monkeypatch.setattr(onnx_export, "export_job", lambda d: exported.append(d))
    monkeypatch.setattr(registry, "register", register)
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        ship(_spec(tmp_path), run, Console(width=400, file=f))
    return exported, " ".join(out.read_text().split())


def _export_check(run: Path) -> dict[str, Any]:
    from musubi.records.checklist import build_checklist

    write_json(run / "fleet.json", {"fleet": "f", "jobs": {p.name: {"state": "done", "causes": []} for p in
                                                           run.iterdir() if p.is_dir()}})
    write_json(run / "run.json", {"config": {"name": "f", "leaderboard": {"export_top": 1}}})
    items = build_checklist(run).to_dict()["items"]
    return next(i for i in items if i["check"] == "export")


def test_an_external_winner_without_a_model_is_said_and_the_next_model_shipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    external_job(run, "ultra", {"metrics": {"map50": 0.9}, "primary_metric": "map50", "kind": "external",
                                "fps": {"fps": 100.0, "runtime": "torch-cpu", "device_name": "cpu"}})
    task_job(run, "frcnn", metrics={"map50": 0.6}, fps=50.0)
    exported, said = _ship(tmp_path, run, monkeypatch)
    assert exported == [run / "frcnn"]
    assert "ultra (rank 1 of map50): an external job that wrote no model.onnx: Musubi has no model of it to " \
           "export or register" in said
    assert "frcnn: exported and registered as frcnn v1 (rank 2 of map50)" in said
    assert "map50: the best is ultra (external job, score 0.9300); shipped: frcnn v1 (rank 2 of map50); not " \
           "shipped: ultra (external, wrote no model.onnx)" in said
    item = _export_check(run)
    assert item["status"] == "PASS", item
    assert "map50: best ultra (external, no model.onnx: not shipped), shipped frcnn" in item["found"]


def test_a_fleet_of_external_jobs_only_ships_nothing_and_passes(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    for name, q in (("yolo-a", 0.7), ("yolo-b", 0.5)):
        external_job(run, name, {"metrics": {"map50": q}, "primary_metric": "map50", "kind": "external",
                                 "fps": {"fps": 30.0, "runtime": "torch-cpu", "device_name": "cpu"}})
    exported, said = _ship(tmp_path, run, monkeypatch)
    assert exported == []
    assert "map50: the best is yolo-a (external job" in said and "nothing shipped: no built-in model to export " \
        "(the ranked jobs are external and wrote no model.onnx)" in said
    assert "exported and registered" not in said
    item = _export_check(run)
    assert item["status"] == "PASS" and item["found"].startswith("no built-in model to export: the ranked jobs are "
                                                                 "external and wrote no model.onnx (yolo-a, yolo-b)")


def test_an_external_winner_exported_from_its_weights_is_shipped_and_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Ultralytics job whose best.pt Musubi had exported (eval.json's model_export): its model.onnx ships, and
    console and checklist say what it is, not "its own model.onnx"."""
    run = tmp_path / "run"
    d = external_job(run, "yolo", {"metrics": {"map50": 0.9}, "primary_metric": "map50", "kind": "external",
                                   "fps": {"fps": 100.0, "runtime": "torch-cpu", "device_name": "cpu"},
                                   "model_export": {"framework": "ultralytics 8.4.190", "nms": True,
                                                    "weights": "runs/detect/train/weights/best.pt"}})
    (d / "model.onnx").write_bytes(b"onnx")
    task_job(run, "frcnn", metrics={"map50": 0.6}, fps=50.0)
    exported, said = _ship(tmp_path, run, monkeypatch)
    assert exported == []  # Musubi's own exporter is for task jobs: the framework exported this one
    assert "yolo: registered the ONNX export of its best.pt (ultralytics 8.4.190's exporter in the job's Python, " \
           "NMS included) (external job) as yolo v1 (rank 1 of map50)" in said, said
    assert "map50: the best is yolo (external job, score 0.9300); shipped: yolo v1 (rank 1 of map50)" in said
    item = _export_check(run)
    assert item["status"] == "PASS" and "map50: best yolo (external: the ONNX export of its best.pt (ultralytics " \
        "8.4.190's exporter in the job's Python, NMS included)), shipped yolo" in item["found"], item
