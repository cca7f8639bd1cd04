"""The launch's checks (musubi/launch/checks.py): each refusal comes before anything is written and before torch
is imported, `--dry-run` runs exactly the launch's list, and a fleet reports every job's problem at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from musubi.cli import app
from musubi.launch import checks
from musubi.launch.request import TrainRequest
from tests.cli.helpers import one_line_error, run
from tests.conftest import REPO, write_tiny_job
from tests.support.pythonpath import repo_on_path

#: A built-in classifier on generated data: the cheap checks know its model, data and sample count.
CLASSIFIER = {"name": "cls", "task": "classification", "model": "resnet18",
              "data": {"synthetic": {"train_size": 64, "val_size": 8, "image_size": 32, "num_classes": 2},
                       "workers": 0},
              "train": {"epochs": 1, "batch": 4}}

#: Runs `musubi ARGS` and says whether torch was imported by the time it exited.
PROBE = ("import sys, runpy; sys.argv = ['musubi'] + sys.argv[1:]\n"
         "try:\n    runpy.run_module('musubi.cli', run_name='__main__')\n"
         "except SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
         "print('torch imported:', 'torch' in sys.modules); sys.exit(code)")


def write_job(directory: Path, **changes: dict) -> Path:
    """CLASSIFIER with `changes` merged per section, as a YAML file."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in CLASSIFIER.items()}
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    path = directory / f"job-{len(list(directory.glob('job-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def probe(args: list[str], cwd: Path) -> tuple[int, str, bool]:
    """(exit code, stdout+stderr, torch imported) of `musubi ARGS` in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=repo_on_path(REPO))
    res = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=120)
    return res.returncode, res.stdout + res.stderr, "torch imported: True" in res.stdout


def refusals(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (musubi arguments, words of the refusal): one per refusal the launch makes before torch."""
    taken = tmp_path / "taken"
    (taken / "cls").mkdir(parents=True)
    (taken / "run.json").write_text("{}")
    (taken / "cls" / "job.json").write_text('{"status": "running"}')
    small = write_job(tmp_path, data={"synthetic": {"train_size": 6, "val_size": 2, "image_size": 32,
                                                    "num_classes": 2}, "workers": 0}, train={"batch": 4})
    return {
        "unknown model": ([str(write_job(tmp_path, model="resnet1800"))], "unknown classification model 'resnet1800'"),
        "missing data": ([str(write_job(tmp_path, data={"synthetic": None, "train": {"path": str(tmp_path / "no")},
                                                        "workers": 0}))], "no such directory"),
        "run folder taken": ([str(write_job(tmp_path)), "--out", str(taken)], "already holds a run"),
        "unwritable out": ([str(write_job(tmp_path)), "--out", "/proc/forbidden"], "filesystem without storage"),
        "split below a batch per rank": ([str(small), "--nproc", "2", "--out", str(tmp_path / "s")],
                                         "holds 6 samples, less than one batch of 4 per rank x 2 ranks"),
        "more ranks than cores": ([str(write_job(tmp_path)), "--nproc", "64"], "--nproc 64 CPU ranks"),
        "bad override": ([str(write_job(tmp_path)), "train.epoch=3"], "did you mean 'epochs'"),
    }


@pytest.mark.parametrize("dry", [False, True], ids=["launch", "dry-run"])
def test_every_refusal_comes_before_torch_and_writes_nothing(tmp_path: Path, dry: bool) -> None:
    """Each refusal: exit 2, one line, torch never imported, no run folder made; the dry run refuses the same."""
    for name, (args, words) in refusals(tmp_path).items():
        before = sorted(p.name for p in tmp_path.rglob("*"))
        code, out, torch = probe(["train", *args, *(["--dry-run"] if dry else [])], tmp_path)
        lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("torch imported")]
        assert code == 2 and words in out and len(lines) == 1 and lines[0].startswith("error:"), (name, out)
        assert not torch, f"{name}: torch was imported before the refusal"
        assert sorted(p.name for p in tmp_path.rglob("*")) == before, f"{name}: something was written"


def test_the_dry_run_and_the_launch_run_the_same_list_of_checks(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One list: the dry run stops after it, the launch spawns after it; both ran every check, in order."""
    ran: list[str] = []

    def recorded(check: checks.Check) -> checks.Check:
        def run_it(a: checks.Admitted) -> None:
            ran.append(check.name)
            check.run(a)
        return checks.Check(check.name, run_it, check.torch)

    monkeypatch.setattr(checks, "CHECKS", tuple(recorded(c) for c in checks.CHECKS))
    job = write_job(tmp_path)
    req = dict(job_path=job, nproc=1, device="cpu", check=False)
    lines = checks.dry_run_plan(TrainRequest(out=tmp_path / "dry", **req))
    assert lines[-1].startswith("checks passed: job file, model name") and not (tmp_path / "dry").exists()
    dry, ran[:] = list(ran), []

    from musubi.launch import launch

    class Spawned(Exception):
        """Raised where torchrun would start."""

    def no_spawn(*args: object, **kwargs: object) -> None:
        raise Spawned

    monkeypatch.setattr(launch, "spawn", no_spawn)
    with pytest.raises(Spawned):
        launch.launch_train(TrainRequest(out=tmp_path / "real", **req))
    assert dry == ran == [c.name for c in checks.CHECKS]
    # the cheap checks come first: nothing that needs torch runs before the last of them
    flags = [c.torch for c in checks.CHECKS]
    assert flags == sorted(flags)


def test_a_metric_no_validation_reports_is_refused_before_the_launch(tmp_path: Path) -> None:
    """checkpoint.best_metric (keep_best) and train.early_stop.metric against the task's declared metric names:
    one line, exit 2, nothing written, launch and dry run alike (the ranks no longer find it at a validation)."""
    (tmp_path / "best").mkdir()
    (tmp_path / "early").mkdir()
    best = write_tiny_job(tmp_path / "best", checkpoint={"keep_best": 1, "best_metric": "accuracy"}, train={"epochs": 1})
    early = write_tiny_job(tmp_path / "early", checkpoint={"keep_best": 0},
                           train={"epochs": 1, "early_stop": {"metric": "accuracy", "patience": 2}})
    for job, words in ((best, "checkpoint.best_metric 'accuracy' is not a validation metric of this task (it "
                              "reports acc, val_count); fix it or set keep_best: 0"),
                       (early, "train.early_stop.metric 'accuracy' is not a validation metric of this task (it "
                               "reports acc, val_count); fix it")):
        for extra in ([], ["--dry-run"]):
            code, out = run(str(job), "--nproc", "2", "--out", str(tmp_path / "run"), "--device", "cpu", *extra)
            assert code == 2 and words in one_line_error(out), out
            assert not (tmp_path / "run").exists()


def test_positional_overrides_are_set_overrides(tmp_path: Path) -> None:
    """`musubi train job.yaml train.epochs=3` as Hydra and Ultralytics users type it, validated by the schema."""
    job = write_job(tmp_path)
    code, out = run(str(job), "train.epochs=3", "data.workers=0", "--device", "cpu", "--dry-run", "--no-check")
    assert code == 0 and "training: 3 epoch(s)" in out, out
    code, out = run(str(job), "train.epocs=3", "--device", "cpu", "--dry-run")
    assert code == 2 and "unknown key train.epocs; did you mean 'epochs'" in one_line_error(out)
    code, out = run(str(job), "train.batch=zero", "--device", "cpu")
    assert code == 2 and "train.batch" in one_line_error(out)


def test_a_fleet_reports_every_jobs_problem_at_once(tmp_path: Path) -> None:
    fleet = {"name": "f3", "defaults": {"task": "classification", "train": {"epochs": 1, "batch": 4}},
             "jobs": [{"name": "a", "model": "resnet1800", "data": CLASSIFIER["data"]},
                      {"name": "b", "model": "resnet18", "data": {"train": {"path": str(tmp_path / "nope")}}},
                      {"name": "c", "model": "resnet18", "train": {"batch": 64},
                       "data": {"synthetic": {"train_size": 8, "val_size": 8, "image_size": 32, "num_classes": 2}}}]}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet), encoding="utf-8")
    for extra in ([], ["--dry-run"]):
        code, out, torch = probe(["run", str(path), "--device", "cpu", "--out", str(tmp_path / "r"), *extra],
                                 tmp_path)
        errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
        assert code == 2 and len(errors) == 3, out
        assert "job 'a': model" in errors[0] and "job 'b': data" in errors[1] and "job 'c': data" in errors[2]
        assert not torch and not (tmp_path / "r").exists()
    # a fleet file whose jobs fail validation: every job's field at once too
    fleet["jobs"] = [{"name": "x", "model": "resnet18", "trian": {}}, {"name": "y", "model": "resnet18", "nproc": 2}]
    path.write_text(yaml.safe_dump(fleet), encoding="utf-8")
    res = CliRunner().invoke(app, ["run", str(path), "--dry-run"])
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 2 and "(x)" in errors[0] and "(y)" in errors[1], res.output


def test_data_hash_imports_no_torch(tmp_path: Path) -> None:
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "a.txt").write_text("hello")
    code, out, torch = probe(["data", "hash", str(tmp_path / "set")], tmp_path)
    assert code == 0 and out.startswith("data-") and not torch, out
