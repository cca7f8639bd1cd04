"""Fleet files: validated before anything starts, errors naming the job and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from musubi.config.fleet import CommandJob, TaskJob
from musubi.config.load import load_fleet
from musubi.contract.errors import ConfigError
from musubi.data.synthetic_files import SyntheticFiles, write_synthetic_coco
from musubi.fleet.jobs import check_command, command_launch
from musubi.fleet.run import validate_fleet
from tests.conftest import REPO, TINY_JOB

FLEETS = sorted((REPO / "examples").glob("fleet-*.yaml"))


def write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "fleet.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def tiny_fleet(**extra) -> dict:
    defaults = {k: v for k, v in TINY_JOB.items() if k != "name"}
    return {"name": "f", "defaults": defaults, "jobs": [{"name": "a"}, {"name": "b", "gpus": 2}], **extra}


#: Fleets that read files their header says to write first, and those files (folder, seed, frames: small, since
#: validation reads them, but a full batch on every rank of the widest job: the launch refuses fewer).
NEEDS_FILES = {name: [("zoo-thermal/train", 0, 64), ("zoo-thermal/val", 1, 2)]
               for name in ("fleet-zoo.yaml", "fleet-zoo-4gpu.yaml")}


@pytest.mark.parametrize("path", FLEETS, ids=[p.name for p in FLEETS])
def test_shipped_fleets_parse_and_validate(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for folder, seed, frames in NEEDS_FILES.get(path.name, []):
        monkeypatch.chdir(tmp_path)  # data paths are relative to where `musubi run` starts
        write_synthetic_coco(tmp_path / folder, SyntheticFiles(images=frames, width=160, height=160, objects=3,
                                                               min_object=16, max_object=48, seed=seed,
                                                               thermal=True), workers=1)
    spec = load_fleet(path)
    validate_fleet(spec, path.parent)
    kinds = {type(j) for j in spec.jobs}
    # The zoo fleets show the built-in models (CNN and transformer, RGB and thermal); the others an external job too.
    assert kinds == ({TaskJob} if path.name in NEEDS_FILES else {TaskJob, CommandJob})


def test_defaults_merge_under_each_job(tmp_path: Path) -> None:
    data = tiny_fleet()
    data["jobs"][1]["train"] = {"batch": 4}
    spec = load_fleet(write(tmp_path, data))
    a, b = spec.jobs
    assert a.spec.train.batch == 8 and b.spec.train.batch == 4 and b.spec.train.lr == 0.1 and b.gpus == 2


@pytest.mark.parametrize("change,needle", [
    (lambda d: d["jobs"].append({"name": "a"}), "jobs[2] (a): name: duplicate of jobs[0]; job names must be unique"),
    (lambda d: d.update(leaderboard={"quality_weight": 0, "fps_weight": 0}), "leaderboard: quality_weight and "
     "fps_weight are both 0"),
    (lambda d: d["jobs"][0].update(model_args={"x": [1]}), "jobs[0] (a): model_args.x"),
    (lambda d: d["jobs"][1].update(trian={"batch": 2}), "jobs[1] (b): unknown key trian"),
    (lambda d: d["jobs"].append({"name": "c", "command": "python train.py --epochs 3"}), "argv list, never a shell"),
    (lambda d: d["jobs"].append({"name": "c", "command": ["x"], "gpus": 2}), "launch: single runs one process"),
    (lambda d: d["jobs"].append({"name": "../c", "command": ["x"]}), "jobs[2] (../c): name"),
    (lambda d: d.update(jobs=[]), "non-empty list"),
])
def test_bad_fleets_name_the_job_and_field(tmp_path: Path, change, needle: str) -> None:
    data = tiny_fleet()
    change(data)
    with pytest.raises(ConfigError) as ei:
        load_fleet(write(tmp_path, data))
    assert needle in str(ei.value) and "\n" not in str(ei.value)
    assert "'defaults'" not in str(ei.value)  # the whole file is never dumped into the message


def test_unknown_model_and_missing_command_refused_before_start(tmp_path: Path) -> None:
    data = tiny_fleet()
    data["jobs"][0].update(task="classification", model="resnet5O")
    with pytest.raises(ConfigError, match="job 'a'.*resnet5"):
        validate_fleet(load_fleet(write(tmp_path, data)), tmp_path)
    job = CommandJob(name="ext", command=["no-such-program-xyz"])
    with pytest.raises(ConfigError, match="command 'no-such-program-xyz' not found"):
        check_command(job, tmp_path)
    job = CommandJob(name="ext", command=["missing.py"])
    with pytest.raises(ConfigError, match="script .*missing.py.* not found"):
        check_command(job, tmp_path)


def test_a_watched_metric_no_validation_reports_is_refused_before_start(tmp_path: Path) -> None:
    """The fleet runs the launch's metric check for every job before any starts (its members skip it then)."""
    data = tiny_fleet()
    data["jobs"][1].update(task="classification", model="resnet18", checkpoint={"best_metric": "top7", "keep_best": 1})
    with pytest.raises(ConfigError, match="job 'b'.*checkpoint.best_metric 'top7' is not a validation metric"):
        validate_fleet(load_fleet(write(tmp_path, data)), tmp_path)


def test_jobs_alike_but_for_their_names_are_checked_with_torch_once(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A config that passed is not built again for the next job alike (the seed fleet's 38 task jobs are 2
    configs); a problem is found for every job that has it, each message naming its own job."""
    from musubi.tasks import registry

    built: list[str] = []
    build = registry.build_task
    monkeypatch.setattr(registry, "build_task", lambda spec: built.append(spec.name) or build(spec))
    data = tiny_fleet()
    data["jobs"] = [{"name": "a"}, {"name": "b"}, {"name": "c", "train": {"lr": 0.2}}, {"name": "d"}]
    validate_fleet(load_fleet(write(tmp_path, data)), tmp_path)
    assert built == ["a", "c"]  # b and d are a's config under other names; c's learning rate is its own
    built.clear()
    bad = {"checkpoint": {"best_metric": "top7", "keep_best": 1}}
    data["jobs"] = [{"name": "a"}, {"name": "x", **bad}, {"name": "y", **bad}]
    with pytest.raises(ConfigError) as ei:
        validate_fleet(load_fleet(write(tmp_path, data)), tmp_path)
    lines = str(ei.value).splitlines()
    assert built == ["a", "x", "y"] and len(lines) == 2, lines
    assert lines[0].startswith("job 'x'") and lines[1].startswith("job 'y'") and all("top7" in ln for ln in lines)


def test_external_job_gets_an_explicit_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "x")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    (tmp_path / "prog.py").write_text("print(1)\n")
    job = CommandJob(name="ext", command=["prog.py", "--n", "1"], env={"MY_FLAG": "1"})
    launch = command_launch(job, tmp_path / "run", [3], "cuda", tmp_path)
    assert launch.argv[1] == str((tmp_path / "prog.py").resolve()) and launch.argv[2:] == ["--n", "1"]
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "3" and launch.env["MY_FLAG"] == "1"
    assert launch.env["MUSUBI_JOB_DIR"] == str((tmp_path / "run" / "ext").resolve())
    assert "SECRET_TOKEN" not in launch.env and launch.env["NCCL_NVLS_ENABLE"] == "0"
    assert launch.cwd == tmp_path / "run" / "ext"


def test_pythonpath_reaches_only_jobs_run_with_musubis_interpreter(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/opt/musubi")
    (tmp_path / "prog.py").write_text("print(1)\n")
    same = command_launch(CommandJob(name="a", command=["prog.py"]), tmp_path / "run", [0], "cuda", tmp_path)
    other = command_launch(CommandJob(name="b", command=["prog.py"], python="/usr/bin/python3"), tmp_path / "run",
                           [0], "cuda", tmp_path)
    assert same.env["PYTHONPATH"] == "/opt/musubi" and "PYTHONPATH" not in other.env


def test_live_table_reads_progress_from_metrics(tmp_path: Path) -> None:
    import io
    import json
    import time

    from rich.console import Console

    from musubi.fleet.local import LocalFleet

    spec = load_fleet(write(tmp_path, tiny_fleet()))
    fleet = LocalFleet(spec, tmp_path / "run", tmp_path, [0, 1], "cpu", False, Console(file=io.StringIO()))
    (tmp_path / "run" / "a").mkdir(parents=True)
    (tmp_path / "run" / "a" / "metrics.jsonl").write_text(json.dumps(
        {"step": 3, "kind": "train", "epoch": 0, "samples_per_s": 12.5, "total_steps": 10}) + "\n")
    st = fleet.states["a"]
    st.state, st.gpus, st.started = "running", [1], time.time() - 3
    out = io.StringIO()
    Console(file=out, width=200).print(fleet.table())
    row = next(ln for ln in out.getvalue().splitlines() if " a " in ln)
    assert "3/10" in row and "12.5" in row and "running" in row and "7s" in row


def test_live_table_names_the_straggler_of_a_running_job(tmp_path: Path) -> None:
    import io
    import json

    from rich.console import Console

    from musubi.fleet.local import LocalFleet

    spec = load_fleet(write(tmp_path, tiny_fleet()))
    fleet = LocalFleet(spec, tmp_path / "run", tmp_path, [0, 1], "cpu", False, Console(file=io.StringIO()))
    tdir = tmp_path / "run" / "a" / "telemetry"
    tdir.mkdir(parents=True)
    flags = [{"kind": "straggler", "rank": 1, "step": 29, "section": "data", "excess": 0.09},
             {"kind": "status", "rank": 1, "step": 50, "section": "data", "excess": 0.214}]
    (tdir / "stragglers.jsonl").write_text("".join(json.dumps(f) + "\n" for f in flags), encoding="utf-8")
    fleet.states["a"].state = "running"

    def row() -> str:
        out = io.StringIO()
        Console(file=out, width=220).print(fleet.table())
        return next(ln for ln in out.getvalue().splitlines() if " a " in ln)

    assert "rank 1 data +21.4%" in row()
    with open(tdir / "stragglers.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": "cleared", "rank": 1, "step": 80}) + "\n")
    assert "rank 1" not in row()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("jobs,extra,needle", [
    ([{"name": "a", "command": ["true"]}, {"name": "big", "command": ["true"], "launch": "torchrun", "gpus": 3}],
     {}, "jobs[1] (big): gpus: 3 > the 2 CPU slots"),
    ([{"name": "a", "command": ["true"]}], {"leaderboard": {"quality_weight": 0, "fps_weight": 0}},
     "fps_weight are both 0"),
])
def test_refused_before_preflight_and_before_any_file(tmp_path: Path, monkeypatch, jobs, extra, needle) -> None:
    from typer.testing import CliRunner

    import musubi.fleet.run as fleet_run
    from musubi.cli import app

    monkeypatch.setattr(fleet_run, "_preflight", lambda *a: pytest.fail("the preflight ran before the refusal"))
    path = write(tmp_path, {"name": "bad", "jobs": jobs, **extra})
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--device", "cpu", "--cpu-slots", "2"])
    assert res.exit_code == 2, res.output
    assert needle in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not out.exists()


def test_declared_memory_larger_than_the_gpu_is_refused(tmp_path: Path) -> None:
    from musubi.fleet.run import refusals

    data = tiny_fleet()
    data["jobs"][1]["memory_gib"] = 120
    spec = load_fleet(write(tmp_path, data))
    assert refusals(spec, [0, 1], "cuda", gpu_memory=79.2) == [
        "jobs[1] (b): memory_gib: 120 > the 79.2 GiB of one GPU here; lower it, or a smaller batch/model"]
    assert refusals(spec, [0, 1], "cuda", gpu_memory=139.8) == []


def test_previous_best_is_found_by_the_fleet_name_in_run_json(tmp_path: Path) -> None:
    from musubi.fleet.local import previous_best
    from musubi.store.rundir import write_json

    runs = tmp_path / "runs"
    for folder, fleet, started, best in (("demo1", "f", "2026-01-01T00:00", "a"),  # --out: any folder name
                                         ("0102-f", "other-f", "2026-01-02T00:00", "b"),  # another fleet
                                         ("0103-f", "f", "2026-01-03T00:00", None)):  # no leaderboard
        write_json(runs / folder / "run.json", {"config": {"name": fleet}, "started": started})
        if best:
            write_json(runs / folder / "leaderboard.json", {"rows": [{"job": best, "rank": 1}]})
    assert previous_best(runs, "f", runs / "demo2") == "a"
    assert previous_best(runs, "other-f", runs / "demo2") == "b"
    assert previous_best(runs, "f", runs / "demo1") is None
    # A newer run that ranked nothing (every model below the quality floor) names no best model.
    write_json(runs / "0104-f" / "run.json", {"config": {"name": "f"}, "started": "2026-01-04T00:00"})
    write_json(runs / "0104-f" / "leaderboard.json", {"rows": [{"job": "zero", "rank": None}]})
    assert previous_best(runs, "f", runs / "demo2") == "a"
    write_json(runs / "0102-f" / "leaderboard.json", {"rows": [{"job": "b", "rank": None}]})
    assert previous_best(runs, "other-f", runs / "demo2") is None


def test_resume_names_jobs_changed_since_the_run_started(tmp_path: Path) -> None:
    from musubi.fleet.run import _resolved, changed_jobs
    from musubi.store.rundir import run_record, write_json

    data = tiny_fleet()
    data["jobs"].append({"name": "ext", "command": ["true"], "env": {"API_TOKEN": "s3cret"}})
    run = tmp_path / "run"
    write_json(run / "run.json", run_record(_resolved(load_fleet(write(tmp_path, data))), ["musubi"]))
    write_json(run / "fleet.json", {"jobs": {"a": {"state": "done"}, "b": {"state": "failed"}}})
    assert changed_jobs(_resolved(load_fleet(write(tmp_path, data))), run) == []  # unchanged (secrets redacted)
    data["jobs"][0]["train"] = {"lr": 0.5}
    data["jobs"][1]["train"] = {"lr": 0.5}
    lines = changed_jobs(_resolved(load_fleet(write(tmp_path, data))), run)
    assert len(lines) == 2
    assert lines[0].startswith("job 'a' changed since it finished") and "new --out" in lines[0]
    assert lines[1].startswith("job 'b' changed since") and "resumes with the new definition" in lines[1]
