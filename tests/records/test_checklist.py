"""The run checklist on crafted run directories (every criterion both ways) and on a real CPU run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from musubi.cli import app
from musubi.config.success import SuccessSpec
from musubi.records.checklist import build_checklist

CONFIG = {"name": "a", "task": "lm", "model": "gpt", "data": {"synthetic": {}}, "train": {"batch": 2}}


def _w(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)


def _job(run: Path, name: str, *, losses=(2.0, 1.5, 1.2, 1.0), rate=100.0, device="cuda", nproc=2,
         status="done", eval_metrics: dict | None = None, config: dict | None = None) -> Path:
    d = run / name
    _w(d / "job.json", {"config": config or {**CONFIG, "name": name}, "status": status, "nproc": nproc,
                        "device": device})
    recs = [{"step": i, "kind": "train", "loss": v, "samples_per_s": rate if i else 1.0} for i, v in enumerate(losses)]
    _w(d / "metrics.jsonl", "\n".join(json.dumps(r) for r in recs) + "\n")
    if eval_metrics is not False:
        _w(d / "eval.json", {"metrics": eval_metrics or {"val_acc": 0.5}, "primary_metric": "val_acc"})
    return d


def _fleet(run: Path, states: dict[str, str], success: dict | None = None, argv=("musubi", "run")) -> None:
    jobs = {n: {"name": n, "kind": "task", "state": s, "gpus": [0, 1]} for n, s in states.items()}
    _w(run / "fleet.json", {"fleet": "f", "jobs": jobs})
    _w(run / "run.json", {"config": {"success": success or {}, "leaderboard": {"export_top": 1}}, "argv": list(argv)})
    _w(run / "preflight.json", {"ok": True, "counts": {"PASS": 6}})
    _w(run / "env.json", {"host": "h", "gpus": [{"name": "H200"}]})


def _items(cl) -> dict[tuple[str | None, str], tuple[str, str]]:
    return {(i.job, i.check): (i.status, i.found) for i in cl.items}


def _shipped(run: Path, job: str) -> None:
    _w(run / "leaderboard.json", {"rows": [{"rank": 1, "job": job, "score": 0.6}]})
    _w(run / job / "export" / "registered.json", {})
    _w(run / "manifest.json", {"models": [{"name": job}]})


def test_a_good_fleet_passes_every_item(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _fleet(run, {"a": "done", "b": "done"})
    _job(run, "a")
    _job(run, "b")
    _shipped(run, "a")
    cl = build_checklist(run)
    items = _items(cl)
    assert cl.ok, cl.items
    assert items[(None, "preflight")][0] == "PASS" and items[("a", "loss")][0] == "PASS"
    assert items[("a", "ranks")] == ("PASS", "all 2 rank(s) finished (synchronous steps need every rank)")
    assert items[(None, "export")][0] == "PASS" and items[(None, "manifest")][0] == "PASS"
    assert items[("a", "gpu_util")][0] == "SKIP"  # no telemetry: not measured, never "met"


def test_a_failed_job_fails_the_run_unless_allowed(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _fleet(run, {"a": "done", "b": "failed"})
    _job(run, "a")
    _job(run, "b", status="failed", eval_metrics=False)
    _shipped(run, "a")
    cl = build_checklist(run)
    assert not cl.ok and _items(cl)[(None, "failures")] == ("FAIL", "1 job(s) failed: b (allowed: 0 by default; success.max_failures allows some)")
    assert build_checklist(run, SuccessSpec(max_failures=1)).ok is False  # b's own "finished" item still fails
    assert _items(build_checklist(run, SuccessSpec(max_failures=1)))[(None, "failures")][0] == "PASS"


@pytest.mark.parametrize("losses, status", [((2.0, float("nan"), 1.0), "FAIL"), ((1.0, 1.1, 1.2, 1.3), "WARN")])
def test_loss_must_be_finite_and_falling(tmp_path: Path, losses, status) -> None:
    run = tmp_path / "r"
    _fleet(run, {"a": "done"})
    _job(run, "a", losses=losses)
    assert _items(build_checklist(run))[("a", "loss")][0] == status


def test_oom_recovered_or_not(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _fleet(run, {"a": "done", "b": "failed"})
    for name, state in (("a", "done"), ("b", "failed")):
        d = _job(run, name, status=state)
        _w(d / "memory" / "applied-oom-1.json", {"per_rank_batch": 64})
    items = _items(build_checklist(run))
    assert items[("a", "oom")] == ("PASS", "1 OOM record(s) (per-rank batch 64), recovered: the job finished")
    assert items[("b", "oom")][0] == "FAIL"


def test_a_rank_that_stopped_progressing_is_named(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _fleet(run, {"a": "done"})
    d = _job(run, "a")
    _w(d / "telemetry" / "rank0.jsonl", '{"step": 10}\n{"step": 20}\n')
    _w(d / "telemetry" / "rank1.jsonl", '{"step": 10}\n')
    status, found = _items(build_checklist(run))[("a", "ranks")]
    assert status == "FAIL" and "rank 1 at step 10" in found


def _history(tmp_path: Path, device: str, old: float, new: float) -> Path:
    for i, rate in enumerate((old, new)):
        run = tmp_path / f"run{i}"
        _fleet(run, {"a": "done"})
        _job(run, "a", rate=rate, device=device)
        _shipped(run, "a")
        os.utime(run, (1_000_000 + i * 100, 1_000_000 + i * 100))  # run1 is newer than run0
    return tmp_path / "run1"


def test_a_throughput_drop_against_earlier_runs_fails_a_gpu_run_when_the_user_wrote_the_limit(tmp_path: Path) -> None:
    run = _history(tmp_path, "cuda", 100.0, 85.0)
    cl = build_checklist(run)  # max_throughput_drop not written: the default 10 % only warns
    status, found = _items(cl)[("a", "throughput")]
    assert status == "WARN" and "-15.0% against the median of 1 earlier run(s)" in found and cl.ok
    assert "a default, not a criterion you wrote" in found
    assert cl.figures["a"]["throughput_change"] == pytest.approx(-0.15)
    _fleet(run, {"a": "done"}, success={"max_throughput_drop": 0.1})
    cl = build_checklist(run)
    assert _items(cl)[("a", "throughput")][0] == "FAIL" and not cl.ok


def test_the_same_drop_on_cpu_ranks_is_a_warning(tmp_path: Path) -> None:
    cl = build_checklist(_history(tmp_path, "cpu", 100.0, 85.0))
    assert _items(cl)[("a", "throughput")][0] == "WARN" and cl.ok


def test_a_small_change_or_another_config_is_not_a_regression(tmp_path: Path) -> None:
    assert _items(build_checklist(_history(tmp_path / "x", "cuda", 100.0, 95.0)))[("a", "throughput")][0] == "PASS"
    run = _history(tmp_path / "y", "cuda", 100.0, 50.0)
    _job(run, "a", rate=50.0, config={**CONFIG, "name": "a", "train": {"batch": 4}})  # another job: no history
    assert _items(build_checklist(run))[("a", "throughput")][0] == "SKIP"


def _telemetry(d: Path, utils=(95, 40), data_ms: float = 300.0) -> None:
    """The telemetry's own formats: sampler records per rank, step records with host/gpu sections in ms."""
    for rank, util in enumerate(utils):
        samples = [{"kind": "sample", "rank": rank, "gpu_index": rank, "util": util} for _ in range(20)]
        _w(d / "telemetry" / f"sampler-rank{rank}.jsonl", "\n".join(json.dumps(r) for r in samples))
    steps = [{"kind": "step", "step": i, "rank": 0, "wall_ms": 1000.0,
              "host": {"data": data_ms, "forward": 300.0, "backward": 700.0 - data_ms}} for i in range(1, 11)]
    for rank in range(len(utils)):
        _w(d / "telemetry" / f"rank{rank}.jsonl", "\n".join(json.dumps(r) for r in steps))


def test_gpu_utilisation_and_data_wait_from_telemetry(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _fleet(run, {"a": "done"})
    _telemetry(_job(run, "a"))
    _shipped(run, "a")
    # Defaults the user did not write: measured and shown, a warning with the figure, exit 0.
    cl = build_checklist(run)
    by = {(i.job, i.check): i for i in cl.items}
    assert cl.ok, cl.items
    assert by[("a", "gpu_util")].status == "WARN" and by[("a", "gpu_util")].criterion == "default"
    assert by[("a", "gpu_util")].found.startswith("after warm-up: GPU 0 95%, GPU 1 40% (below 80%: a default")
    assert by[("a", "data_wait")].status == "WARN"
    assert by[("a", "data_wait")].found.startswith("30.0% of step time waiting for data (above 10%: a default")
    # The same thresholds written in the fleet's success: block are criteria: FAIL.
    _fleet(run, {"a": "done"}, success={"min_gpu_util": 0.8, "max_data_wait": 0.1})
    cl = build_checklist(run)
    items = _items(cl)
    assert items[("a", "gpu_util")] == ("FAIL", "after warm-up: GPU 0 95%, GPU 1 40% (below 80%)")
    assert items[("a", "data_wait")] == ("FAIL", "30.0% of step time waiting for data (above 10%)")
    assert not cl.ok and {i.criterion for i in cl.items if i.check in ("gpu_util", "data_wait")} == {"yours"}
    assert build_checklist(run, SuccessSpec(min_gpu_util=0.3, max_data_wait=0.5)).ok
    # A job's own success: (in the fleet file or its defaults:) beats the fleet's, for that job.
    _job(run, "a", config={**CONFIG, "name": "a", "success": {"min_gpu_util": 0.3, "max_data_wait": 0.5}})
    assert build_checklist(run).ok


def test_criteria_written_in_a_fleet_file_survive_its_records(tmp_path: Path) -> None:
    """The fleet's success:, its defaults: and a job's own success: are the user's, through run.json/job.json."""
    from musubi.config.load import load_fleet
    from musubi.fleet.run import _resolved
    from musubi.store.rundir import run_record

    body = {k: v for k, v in CONFIG.items() if k != "name"}
    path = tmp_path / "fleet.yaml"
    path.write_text(json.dumps({"name": "f", "success": {"min_gpu_util": 0.5, "min_score": 0.7},
                                "defaults": {**body, "success": {"max_data_wait": 0.2}},
                                "jobs": [{"name": "a"}, {"name": "b", "success": {"min_gpu_util": 0.1}}]}))
    spec = load_fleet(path)
    run = tmp_path / "r"
    _fleet(run, {"a": "done", "b": "done"})
    _w(run / "run.json", run_record(_resolved(spec), ["musubi", "run"]))
    for job in spec.jobs:
        _telemetry(_job(run, job.name, config=job.spec.resolved()), utils=(40, 40))
    _shipped(run, "a")
    by = {(i.job, i.check): i for i in build_checklist(run).items}
    assert (by[("a", "gpu_util")].status, by[("a", "gpu_util")].criterion) == ("FAIL", "yours")  # the fleet's 0.5
    assert (by[("b", "gpu_util")].status, by[("b", "gpu_util")].criterion) == ("PASS", "yours")  # its own 0.1
    assert (by[("b", "data_wait")].status, by[("b", "data_wait")].criterion) == ("FAIL", "yours")  # defaults: 0.2
    assert (by[("a", "throughput")].status, by[(None, "failures")].criterion) == ("SKIP", "default")
    assert by[(None, "score")].status == "FAIL" and by[(None, "score")].criterion == "yours"


def test_speedup_against_the_single_gpu_baseline(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _fleet(run, {"a": "done"}, success={"min_scaling_efficiency": 0.9})
    d = _job(run, "a", rate=180.0)
    _shipped(run, "a")
    success = SuccessSpec(min_scaling_efficiency=0.9)
    assert _items(build_checklist(run, success))[("a", "speedup")][0] == "SKIP"  # no baseline: not measured
    _w(d / "baseline.json", {"samples_per_s": 100.0})
    cl = build_checklist(run)  # the criterion comes from run.json's success section
    assert _items(cl)[("a", "speedup")] == ("PASS", "1.80x over one GPU (100.0 samples/s), 90% scaling efficiency on 2 GPUs")
    _w(d / "baseline.json", {"samples_per_s": 120.0})
    assert _items(build_checklist(run))[("a", "speedup")][0] == "FAIL"


def test_min_score_of_a_fleet(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _fleet(run, {"a": "done"}, success={"min_score": 0.7})
    _job(run, "a")
    _shipped(run, "a")
    cl = build_checklist(run)
    assert _items(cl)[(None, "score")] == ("FAIL", "best score 0.6000 < 0.7") and not cl.ok


def test_checklist_command_exit_codes(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _fleet(run, {"a": "done"})
    _job(run, "a")
    _shipped(run, "a")
    res = CliRunner().invoke(app, ["checklist", str(run), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["ok"] and (run / "checklist.json").is_file()
    _telemetry(run / "a", utils=(30, 30))  # below the default min_gpu_util: a warning, exit 0
    res = CliRunner().invoke(app, ["checklist", str(run)])
    assert res.exit_code == 0 and "criterion" in res.output and "default" in res.output, res.output
    _fleet(run, {"a": "done"}, success={"min_gpu_util": 0.8})  # the same threshold written down: exit 1
    res = CliRunner().invoke(app, ["checklist", str(run), "--json"])
    assert res.exit_code == 1 and not json.loads(res.output)["ok"], res.output
    _fleet(run, {"a": "failed"})
    assert CliRunner().invoke(app, ["checklist", str(run)]).exit_code == 1
    res = CliRunner().invoke(app, ["checklist", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "no such run directory" in res.output
    (tmp_path / "empty").mkdir()
    assert CliRunner().invoke(app, ["checklist", str(tmp_path / "empty")]).exit_code == 2


def test_job_names_are_printed_literally(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _fleet(run, {"[red]x": "done"})
    _job(run, "[red]x")
    res = CliRunner().invoke(app, ["checklist", str(run)])
    assert "[red]x" in res.output  # rich markup in a name is data, not style


def test_eval_lines_state_what_the_files_hold(tmp_path: Path) -> None:
    """Without metrics the eval line says whether eval.json exists and whether a validation split is set."""
    files = {**CONFIG, "task": "detection", "data": {"train": {"path": "t"}, "val": {"path": "v"}}}
    cases = {  # job -> (config, eval.json written, fleet status, train status)
        "val-empty": (files, True, "FAIL", "WARN"),
        "val-none": (files, False, "FAIL", "WARN"),
        "no-val": ({**CONFIG, "data": {"synthetic": {"val_size": 0}}}, False, "FAIL", "SKIP"),
    }
    expected = {"val-empty": "eval.json has no metrics (although the job has a validation split)",
                "val-none": "no eval.json (although the job has a validation split)",
                "no-val": "no eval.json (the job has no validation split)"}
    for fleet in (True, False):
        for name, (config, written, in_fleet, alone) in cases.items():
            run = tmp_path / f"{name}-{fleet}"
            if fleet:
                _fleet(run, {name: "done"})
            d = _job(run, name, eval_metrics=False, config={**config, "name": name})
            if written:
                _w(d / "eval.json", {"metrics": {}, "primary_metric": "map50"})
            assert _items(build_checklist(run))[(name, "eval")] == (in_fleet if fleet else alone, expected[name])


@pytest.mark.slow  # a real 2-rank launch
@pytest.mark.timeout(300)
def test_musubi_train_ends_with_its_checklist(tiny_job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real 2-rank CPU job ends with its checklist; the same launch logs to a local MLflow store when the `mlflow`
    extra is installed (`make test` installs it): its params and metrics once (rank 0). One launch for both."""
    import importlib.util

    from tests.support.runs import train

    tracked = importlib.util.find_spec("mlflow") is not None
    job = tiny_job(tracking={"mlflow": True, "mlflow_experiment": "exp-1"}) if tracked else tiny_job()
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "run"), "--no-check")
    assert code == 0, out
    cl = json.loads((tmp_path / "run" / "checklist.json").read_text())
    assert cl["ok"] and "run met its criteria" in out
    checks = {(i["job"], i["check"]): i["status"] for i in cl["items"]}
    assert checks[("tiny", "loss")] in ("PASS", "WARN") and checks[(None, "preflight")] == "WARN"
    if not tracked:  # the MLflow half needs the `mlflow` extra; the checklist half ran
        return
    import mlflow

    store = tmp_path / "run" / "mlruns"
    assert store.is_dir()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.MlflowClient(tracking_uri=store.resolve().as_uri())
    exp = client.get_experiment_by_name("exp-1")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1  # rank 0 only
    run = runs[0]
    assert run.data.params["name"] == "tiny" and run.data.params["train.batch"]
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert losses and all(m.value == m.value for m in losses)  # finite, one point per log record
    assert (tmp_path / "run" / "tiny" / "mlflow_run_id").read_text() == run.info.run_id


def test_low_goodput_without_failure_is_a_warning_on_a_long_run_only(tmp_path: Path) -> None:
    """Goodput 44 % with no failure warns on a run of 10 min or more; on a short run (start-up is most of it by
    nature) it passes and states the split, start-up share included. The item says where the wall time went."""
    run = tmp_path / "r"
    _fleet(run, {"a": "done", "b": "done", "c": "done"})
    _w(_job(run, "a") / "goodput.json", {"goodput": 0.44, "wall_s": 1200.0, "productive_s": 528.0,
                                         "startup_s": 30.0, "failures": []})
    _w(_job(run, "b") / "goodput.json", {"goodput": 0.93, "wall_s": 300.0, "productive_s": 279.0, "failures": []})
    _w(_job(run, "c") / "goodput.json", {"goodput": 0.44, "wall_s": 23.2, "productive_s": 10.2, "startup_s": 10.0,
                                         "failures": []})
    items = _items(build_checklist(run))
    status, found = items[("a", "restarts")]
    assert status == "WARN", found
    assert found.startswith("no failure, but goodput 44.0%") and "30.0s (2%) start-up before the first step" in found
    assert "642.0s after them" in found
    assert items[("b", "restarts")] == ("PASS", "no failure; goodput 93.0%")
    status, found = items[("c", "restarts")]
    assert status == "PASS", found
    assert found.startswith("no failure; goodput 44.0%: of 23.2s wall, 10.0s (43%) start-up") and "3.0s after" in found
    assert "a run under 10 min is mostly start-up by nature" in found


def test_the_console_summary_is_short_and_names_every_failure_and_warning(tmp_path: Path) -> None:
    """The console's checklist: the verdict with the score, each FAIL and WARN item in full, the file; the
    passing and unmeasured items stay in checklist.json (their count is said)."""
    from musubi.records.checklist import summary_lines

    run = tmp_path / "r"
    _fleet(run, {"a": "done", "b": "failed", "c": "done"})
    _job(run, "a")
    _job(run, "b", status="failed", eval_metrics=False)
    _job(run, "c", losses=(1.0, 1.2, 1.5, 2.0), eval_metrics=False)
    _shipped(run, "a")
    cl = build_checklist(run)
    lines = summary_lines(cl)
    bad = [i for i in cl.items if i.status in ("FAIL", "WARN")]
    assert len(bad) >= 3 and len(lines) == len(bad) + 2, lines
    for i in bad:  # every failing and warning item reaches the console whole
        assert any(line == f"  {i.status} {i.job + ' ' if i.job else ''}{i.check}: {i.found}" for line in lines), i
    assert lines[0].startswith("run did NOT meet its criteria: ") and "best a score 0.6 (1 ranked)" in lines[0]
    assert lines[-1] == f"full checklist: {run / 'checklist.json'} (as a table: musubi checklist {run})"
    assert [ln[2:6] for ln in lines[1:-1]] == sorted((ln[2:6] for ln in lines[1:-1]), key=["FAIL", "WARN"].index)


def test_cpu_ranks_are_named_as_such(tmp_path: Path) -> None:
    """A CPU run's items speak of CPU ranks, not GPUs: nothing to sample, a speed-up over one CPU rank."""
    run = tmp_path / "r"
    _fleet(run, {"a": "done"}, success={"min_speedup": 1.5})
    d = _job(run, "a", device="cpu")
    _w(d / "baseline.json", {"samples_per_s": 55.0})
    items = _items(build_checklist(run))
    assert items[("a", "gpu_util")] == ("SKIP", "CPU ranks: no GPU to sample")
    assert items[("a", "speedup")][1].startswith("1.82x over one CPU rank (55.0 samples/s), 91% scaling efficiency "
                                                 "on 2 CPU ranks"), items[("a", "speedup")]


def test_a_single_job_summary_names_its_headline_metric(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _job(run, "a", eval_metrics={"val_acc": 0.875})
    _w(run / "run.json", {"config": {}, "argv": ["musubi", "train"]})
    _w(run / "preflight.json", {"ok": True, "counts": {"PASS": 6}})
    from musubi.records.checklist import summary_lines

    lines = summary_lines(build_checklist(run))
    assert lines[0].startswith("run met its criteria: ") and lines[0].endswith("; val_acc 0.875 (a)"), lines


def test_checklist_takes_a_job_folder_like_report(tmp_path: Path) -> None:
    """`musubi checklist RUN/JOB`: that job's items (and the preflight); RUN/checklist.json stays the run's."""
    run = tmp_path / "r"
    _fleet(run, {"a": "done", "b": "failed"})
    _job(run, "a")
    _job(run, "b", status="failed", eval_metrics=False)
    _shipped(run, "a")
    res = CliRunner().invoke(app, ["checklist", str(run / "a"), "--json"])
    assert res.exit_code == 0, res.output
    jobs = {i["job"] for i in json.loads(res.output)["items"]}
    assert jobs == {None, "a"}
    assert json.loads((run / "checklist.json").read_text())["ok"] is False  # the whole run, b included
    assert CliRunner().invoke(app, ["checklist", str(run / "b")]).exit_code == 1
