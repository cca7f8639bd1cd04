"""The fleet's early export in its tail: the decision rule, the evaluation step's rank check and export (as ship()
exports), ship() reusing an export of the newest checkpoint, and a tiny CPU fleet whose job exports during its
evaluation while another job still runs."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from musubi.cli import app
from musubi.config.fleet import LeaderboardSpec
from musubi.config.load import load_fleet
from musubi.contract.errors import ConfigError
from musubi.evaluate.score import ScoreRule
from musubi.fleet import eval_step
from musubi.fleet.eval_step import ExportAsk, export_ask, ranks_for_export
from musubi.fleet.local import EARLY_EXPORT_MARGIN_S, early_export, export_request
from musubi.fleet.ship import exported_current, ship
from musubi.store.rundir import write_json
from musubi.store.startup import EVAL_GPU_DONE, marks_of


def test_the_rule_exports_beside_a_long_job_or_the_next_one_only() -> None:
    long = EARLY_EXPORT_MARGIN_S + 30.0
    # the longest other job is named
    assert early_export(1, 0, {"resnet50": long, "mlp": 2.0}) == f"tail; resnet50 still trains ~{long:.0f} s"
    assert early_export(1, 0, {}) is None  # the last job to end: its export could lengthen the fleet
    assert early_export(1, 0, {"mlp": EARLY_EXPORT_MARGIN_S - 1}) is None  # the other job ends too soon
    assert early_export(1, 0, {"overdue": -5.0}) is None  # past its prediction: it may end any moment
    assert early_export(1, 1, {"resnet50": long}) is None  # a job waits for the freed GPUs: it goes first
    # ... unless the step hands its GPUs over before exporting (machine.overlap): the export runs beside that job
    for others in ({}, {"resnet50": long}):
        assert early_export(1, 2, others, gpus_back_first=True) == \
            "beside the next job on its GPUs, which it no longer holds back"
    assert early_export(1, 0, {}, gpus_back_first=True) is None  # nothing after it: still the last job
    assert early_export(0, 0, {"resnet50": long}) is None  # the fleet exports nothing
    assert early_export(0, 1, {}, gpus_back_first=True) is None


def _evaluated(run: Path, name: str, top1: float, fps: float) -> None:
    """A job as its evaluation step leaves it: job.json, eval.json with metrics and FPS."""
    write_json(run / name / "job.json", {"config": {"name": name, "task": "classification", "model": "resnet18"},
                                         "status": "done"})
    write_json(run / name / "eval.json", {"metrics": {"top1": top1}, "primary_metric": "top1", "kind": "task",
                                          "fps": {"fps": fps, "runtime": "torch-cuda"}})


def test_the_marker_carries_the_leaderboards_settings(tmp_path: Path) -> None:
    marker = tmp_path / "trained.json"
    lb = LeaderboardSpec(export_top=2, quality_weight=0.6, fps_weight=0.4, fps_target=30, quality_floor=0.3)
    write_json(marker, {"attempt": 1, "export": export_request(lb)})
    assert export_ask(marker) == ExportAsk(2, ScoreRule(0.6, 0.4, 30.0, 0.3))
    for asked in (False, True, {"top": 1}, {**export_request(lb), "weights": [0, 0]}):  # one format; bad: none
        write_json(marker, {"attempt": 1, "export": asked})
        assert export_ask(marker) is None, asked


def test_only_a_job_ranking_within_the_top_k_so_far_exports(tmp_path: Path) -> None:
    run, ask = tmp_path / "run", ExportAsk(1, ScoreRule(0.7, 0.3, None, 0.5))
    _evaluated(run, "gpt", 0.55, 20.0)
    assert ranks_for_export(run / "gpt", ask) == (True, "rank 1 of 1 evaluated, the fleet exports the top 1")
    _evaluated(run, "r18", 0.9, 900.0)
    write_json(run / "late" / "job.json", {"config": {"name": "late", "task": "classification"},
                                           "status": "running"})  # not evaluated yet: not counted
    assert ranks_for_export(run / "gpt", ask) == (False, "rank 2 of 2 evaluated, the fleet exports the top 1")
    assert ranks_for_export(run / "r18", ask)[0]
    assert ranks_for_export(run / "gpt", ExportAsk(2, ask.rule))[0]
    _evaluated(run, "fast", 0.1, 5000.0)  # fastest, but under the quality floor: never ranked, never exported
    ok, why = ranks_for_export(run / "fast", ExportAsk(3, ask.rule))
    assert not ok and why.startswith("not ranked among 2 evaluated (below the quality floor"), why


def test_the_evaluation_step_exports_as_ship_does_within_the_top_k_only(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    from tests.evaluate.jobs import CLASSIFY, make_task_job

    run = tmp_path / "run"
    job = make_task_job(run, CLASSIFY, steps=1, metrics={"top1": 0.5})
    _evaluated(run, "rival", 0.9, 1e9)
    marker = tmp_path / "trained.json"
    write_json(marker, {"attempt": 1, "export": export_request(LeaderboardSpec(export_top=1))})
    assert eval_step.main(["--after", str(marker), str(job)]) == 0
    assert "no early export: rank 2 of 2 evaluated, the fleet exports the top 1" in capsys.readouterr().out
    assert "export" not in json.loads((job / "eval.json").read_text()) and not (job / "export").exists()
    shutil.rmtree(run / "rival")
    assert eval_step.main(["--after", str(marker), str(job)]) == 0
    assert "early export (rank 1 of 1 evaluated, the fleet exports the top 1): export/model.onnx" in \
        capsys.readouterr().out
    record = json.loads((job / "eval.json").read_text())
    assert set(record["export"]) == {"file", "record", "sha256", "opset", "parity_ok"} and \
        record["export"]["parity_ok"], record["export"]
    # What ship() does, nothing more: no ONNX Runtime FPS (a GPT's evaluation step with it, export and
    # timing together, ran 89 s on 4x H200, 2026-11-27).
    assert not [k for k in record["fps_all"] if k.startswith("onnxruntime")], record["fps_all"]
    assert exported_current(job)
    # Where the step's seconds went: model load, FPS, then the export only where it exported (the second run).
    marks = [json.loads(line)["mark"] for line in (job / "startup.jsonl").read_text().splitlines()]
    # The GPUs' last use is marked before the export (the fleet hands them to the next job there).
    assert marks == ["eval_ready", "eval_loaded", "eval_fps", "eval_gpu_done", "evaluated",
                     "eval_ready", "eval_loaded", "eval_fps", "eval_gpu_done", "eval_exported", "evaluated"], marks


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
    from musubi.evaluate import onnx_export, registry

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
    (tmp_path / "ext.py").write_text(EXTERNAL)
    # min_quality 0: two steps leave r18 at chance, below the default top-1 floor; this test is about when it exports
    data = {"name": "tail", "leaderboard": {"export_top": 1, "promote": False, "min_quality": {"top1": 0.0}},
            "defaults": {"task": "classification", "model": "resnet18",
                         "data": {"synthetic": {"train_size": 16, "val_size": 8, "image_size": 32,
                                                "num_classes": 4}, "workers": 0},
                         "train": {"max_steps": 2, "batch": 8, "log_every": 1}},
            "machine": {"overlap": True},
            # r18 first (its priority), ext waits for its slot
            "jobs": [{"name": "r18", "priority": 1}, {"name": "ext", "command": ["ext.py"]}]}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    # One slot with machine.overlap on (the GPUs' default): ext is placed on r18's slot when r18's training ends
    # and is spawned once r18's evaluation step has measured FPS (eval_gpu_done), so r18's export, asked because
    # ext waits, runs beside ext: ext waits for that export (EXTERNAL above), which never comes if the step
    # held the slot to its end or the rule still refused to export while a job waits.
    res = CliRunner().invoke(app, ["run", str(fleet), "--out", str(out), "--device", "cpu", "--cpu-slots", "1"])
    assert res.exit_code == 0, res.output
    rec = json.loads((out / "fleet.json").read_text())
    r18 = rec["jobs"]["r18"]
    assert r18["early_export"] == "beside the next job on its GPUs, which it no longer holds back" and \
        r18["history"][-1]["early_export"], r18
    marks = marks_of(out / "r18")
    spawned = rec["jobs"]["ext"]["history"][-1]["spawned"]
    assert marks["eval_fps"] <= marks[EVAL_GPU_DONE] <= spawned < marks["eval_exported"], (marks, spawned)
    assert rec["jobs"]["ext"]["early_export"] == "" and isinstance(rec["ship_s"], float)
    # The fleet's own start-up before its first job, by component (here in pytest's process: its "python" is long).
    parts = rec["startup"]
    assert list(parts)[1:] == ["fleet imports (torch)", "job checks", "GPU count, refusals", "run records",
                               "executor set-up (history, topology)", "in all"] and all(v >= 0 for v in parts.values()), parts
    # ... and its end phase: the checklist after shipping (bench/fleet.py splits the time after the last job).
    assert rec["checklist_s"] >= 0 and rec["checked_at"] >= max(h["ended"] for j in rec["jobs"].values()
                                                                 for h in j["history"])
    assert rec["exported_early"] == ["r18"], rec["exported_early"]
    asked = json.loads((out / "r18" / "logs" / "trained.json").read_text())["export"]
    assert asked == {"top": 1, "weights": [0.7, 0.3], "fps_target": None, "quality_floor": 0.5,
                     "min_quality": {"top1": 0.0}}, asked
    assert "export r18 early if it ranks in the top 1 so far (beside the next job" in res.output, res.output
    # Exported once, in the evaluation step after its FPS was measured (rank 1 of 1: ext has no eval.json yet),
    # as ship() exports (no ONNX Runtime timing), and registered as it was.
    export = json.loads((out / "r18" / "export" / "export.json").read_text())
    evaluated = json.loads((out / "r18" / "eval.json").read_text())
    assert export["created"] > evaluated["evaluated"] and evaluated["export"]["parity_ok"], (export, evaluated)
    assert list(evaluated["fps_all"]) == ["torch-cpu"], evaluated["fps_all"]
    assert "early export (rank 1 of 1 evaluated, the fleet exports the top 1): export/model.onnx" in \
        (out / "r18" / "logs" / "fleet.log").read_text()
    assert "r18: registered (exported early) as r18 v1 (rank 1 of top1)" in res.output and "export done early for: r18" in res.output
    assert "export done early for: r18" in (out / "fleet.log").read_text()
