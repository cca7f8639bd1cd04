"""bench/fleet.py's own logic: each fleet job's time split against its run alone ((a))."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import yaml

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("fleet_bench", REPO / "bench" / "fleet.py")
fleet_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fleet_bench)


def _attempt(started: float, spawned: float, released: float, ended: float) -> dict:
    return {"history": [{"attempt": 1, "started": started, "spawned": spawned, "released": released,
                         "ended": ended, "outcome": "done"}]}


def test_parts_of_each_job_against_its_run_alone() -> None:
    # The six-job fleet of 4x H200 (2026-11-27), three of its jobs: fcos ran 163.6 s against 147.5 s alone;
    # ext-detector-b waited 5.8 s behind fcos's evaluation step, then ran 60.7 s against 53.5 s alone.
    rec = {"jobs": {
        "fcos": _attempt(0.0, 0.0, 163.6, 169.1),
        "ext-detector-b": _attempt(163.6, 169.4, 230.1, 231.1),
        "fcos-c2": _attempt(0.0, 0.0, 161.3, 167.5),  # a copy: fcos's work, compared with fcos alone
        "unmeasured": _attempt(0.0, 0.0, 10.0, 11.0),  # no run alone: listed, left out of the sums
        "failed-early": {"history": [{"attempt": 1, "started": 5.0, "spawned": 5.0, "ended": None}]},
    }}
    out = fleet_bench.against_alone(rec, {"fcos": 147.5, "ext-detector-b": 53.5})
    jobs = out["jobs"]
    assert jobs["fcos"] == {"width": 1, "waited_s": 0.0, "ran_s": 163.6, "evaluation_s": 5.5, "alone_s": 147.5,
                            "ran_vs_alone": pytest.approx(1.109, abs=1e-3)}
    assert jobs["ext-detector-b"]["waited_s"] == 5.8 and jobs["ext-detector-b"]["ran_s"] == 60.7
    assert jobs["ext-detector-b"]["ran_vs_alone"] == pytest.approx(1.135, abs=1e-3)
    assert jobs["fcos-c2"]["alone_s"] == 147.5 and jobs["fcos-c2"]["ran_vs_alone"] == pytest.approx(1.094, abs=1e-3)
    assert jobs["unmeasured"]["alone_s"] is None and jobs["unmeasured"]["ran_vs_alone"] is None
    assert "failed-early" not in jobs
    # Sums over the jobs with a run alone: 16.1 + 7.2 + 13.8 s longer, 5.5 + 1.0 + 6.2 s of evaluation.
    assert out["sums"] == {"waited_s": 5.8, "ran_beyond_alone_s": pytest.approx(37.1, abs=0.05),
                           "evaluation_s": pytest.approx(12.7, abs=0.05)}


def test_a_job_the_fleet_widened_is_not_compared_with_its_one_gpu_run() -> None:
    rec = {"jobs": {"r50": {"history": [{"attempt": 1, "gpus": [0, 1], "started": 0.0, "spawned": 0.0,
                                         "released": 100.0, "ended": 104.0}]}}}
    out = fleet_bench.against_alone(rec, {"r50": 190.0})
    assert out["jobs"]["r50"]["width"] == 2 and out["jobs"]["r50"]["alone_s"] is None
    assert out["jobs"]["r50"]["ran_vs_alone"] is None and out["sums"]["ran_beyond_alone_s"] == 0


def test_a_job_named_like_a_copy_but_measured_alone_keeps_its_own_time() -> None:
    rec = {"jobs": {"yolo-c2": _attempt(0.0, 0.0, 50.0, 51.0)}}
    out = fleet_bench.against_alone(rec, {"yolo-c2": 40.0, "yolo": 100.0})
    assert out["jobs"]["yolo-c2"]["alone_s"] == 40.0


def test_only_keeps_the_named_jobs_and_their_waits_on_kept_jobs(tmp_path) -> None:
    fleet = tmp_path / "f.yaml"
    fleet.write_text("name: f\njobs:\n"
                     "  - {name: a, command: [x.py], gpus: 1}\n"
                     "  - {name: b, command: [x.py], gpus: 1, after: [a]}\n"
                     "  - {name: c, command: [x.py], gpus: 1, after: [a, b]}\n")
    only = fleet_bench.with_only(fleet, ["b", "c"])
    assert only.parent == fleet.parent  # beside the file: its relative commands resolve as before
    jobs = yaml.safe_load(only.read_text())["jobs"]
    assert [j["name"] for j in jobs] == ["b", "c"]
    assert "after" not in jobs[0] and jobs[1]["after"] == ["b"]
    with pytest.raises(SystemExit, match="--only nope: no such job"):
        fleet_bench.with_only(fleet, ["b", "nope"])


def test_a_fleet_that_missed_its_criteria_with_every_job_done_still_counts(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "fleet.json").write_text('{"jobs": {"a": {"state": "done"}, "b": {"state": "done"}}}')
    assert fleet_bench.all_done(run)
    (run / "fleet.json").write_text('{"jobs": {"a": {"state": "done"}, "b": {"state": "failed"}}}')
    assert not fleet_bench.all_done(run)
    assert not fleet_bench.all_done(tmp_path / "absent")
    # The command's exit decides: accepted, it is timed; refused, it raises with its output.
    argv = [sys.executable, "-c", "import sys; print('criteria not met'); sys.exit(1)", "x"]
    assert fleet_bench._run(argv, {}, tmp_path, accept=lambda code: code in (0, 1)) > 0
    with pytest.raises(RuntimeError, match="criteria not met"):
        fleet_bench._run(argv, {}, tmp_path)
