"""`musubi train` guardrails decided before torch or torchrun: CPU ranks against cores, a resume against
the recorded job, a finished run, `--dry-run`, and config errors that never wait for torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.cli.helpers import one_line_error, run
from tests.conftest import REPO
from tests.support.pythonpath import repo_on_path


def _recorded_run(job: Path, run_dir: Path, status: str, **config_changes: dict) -> Path:
    """A run directory as `musubi train` leaves it: RUN/JOB/job.json with the resolved job and a status."""
    from musubi.config.load import load_job

    config = load_job(job).resolved()
    for section, values in config_changes.items():
        config[section].update(values)
    job_dir = run_dir / config["name"]
    job_dir.mkdir(parents=True)
    (job_dir / "job.json").write_text(json.dumps({"config": config, "status": status, "attempts": 1,
                                                  "history": []}), encoding="utf-8")
    return job_dir


def test_more_cpu_ranks_than_cores_is_refused_with_the_number_that_fits(tiny_job, tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    code, out = run(str(tiny_job()), "--nproc", str(cores + 62), "--device", "cpu", "--out", str(tmp_path / "r"))
    line = one_line_error(out)
    assert code == 2 and f"--nproc {cores} or fewer" in line and "--oversubscribe" in line
    assert not (tmp_path / "r").exists()
    # the explicit flag lets it through to the next check (here: the plan, nothing launched)
    code, out = run(str(tiny_job()), "--nproc", str(cores + 1), "--oversubscribe", "--device", "cpu",
                    "--out", str(tmp_path / "r"), "--dry-run")
    assert code == 0 and f"ranks: {cores + 1} CPU" in out, out


def test_dry_run_prints_the_plan_and_writes_nothing(tiny_job, tmp_path: Path) -> None:
    # tiny: batch 8, lr 0.1 tuned at base_batch 16, linear rule; 2 ranks -> global 16, lr unchanged;
    # with --set train.batch=16 the global batch doubles and so does the LR, and the plan says why.
    code, out = run(str(tiny_job()), "--nproc", "2", "--device", "cpu", "--out", str(tmp_path / "r"), "--dry-run",
                    "--set", "train.batch=16")
    assert code == 0, out
    assert "ranks: 2 CPU (gloo) ranks" in out
    assert "batch: 16 per rank x 2 rank(s) x 1 accumulation = 32 global" in out
    assert "lr: 0.2 (linear rule: 0.1 tuned at base_batch 16, x (32/16))" in out
    assert "data: synthetic: 128 train / 30 val samples" in out
    assert f"output: {tmp_path / 'r' / 'tiny'} (new)" in out
    assert "nothing started, nothing written" in out
    assert not (tmp_path / "r").exists()
    # a bad job is refused the same way a launch refuses it
    code, out = run(str(tiny_job(model="resnet5O", task="classification")), "--device", "cpu", "--dry-run")
    assert code == 2 and "resnet5" in one_line_error(out)


def test_resume_refuses_a_changed_job_unless_allowed(tiny_job, tmp_path: Path) -> None:
    job = tiny_job()
    job_dir = _recorded_run(job, tmp_path / "r", "stopped", train={"lr": 0.5})
    before = (job_dir / "job.json").read_bytes()
    code, out = run(str(job), "--nproc", "2", "--device", "cpu", "--out", str(tmp_path / "r"), "--resume")
    line = one_line_error(out)
    assert code == 2 and "train.lr 0.5 -> 0.1" in line and "--allow-changes train.lr" in line
    assert (job_dir / "job.json").read_bytes() == before
    # listed: the change passes; this run has no committed checkpoint (stopped before its first save), so the
    # resume would start from step 0 in the same folder (the dry run runs the launch's checks and says so)
    code, out = run(str(job), "--device", "cpu", "--out", str(tmp_path / "r"), "--resume", "--allow-changes",
                    "train.lr", "--dry-run", "--no-check")
    assert code == 0 and "no committed checkpoint" in out and "would start from step 0 in this folder" in out, out
    assert (job_dir / "job.json").read_bytes() == before
    # with a committed checkpoint a section covers its fields; an unknown field is refused by name
    from musubi.checkpoint.checkpoint import MARKER

    (job_dir / "checkpoints" / "step-000000004").mkdir(parents=True)
    (job_dir / "checkpoints" / "step-000000004" / MARKER).write_text(json.dumps({"step": 4, "files": {}}))
    code, out = run(str(job), "--device", "cpu", "--out", str(tmp_path / "r"), "--resume", "--allow-changes",
                    "train", "--dry-run", "--no-check")
    assert code == 0 and "resume: train.lr 0.5 -> 0.1 (--allow-changes)" in out, out
    code, out = run(str(job), "--device", "cpu", "--out", str(tmp_path / "r"), "--resume", "--allow-changes",
                    "train.lrr")
    assert code == 2 and "'lrr' is not a job field" in one_line_error(out)


def test_resume_of_a_finished_run_is_reported_without_launching(tiny_job, tmp_path: Path) -> None:
    job = tiny_job()
    job_dir = _recorded_run(job, tmp_path / "r", "done")
    before = (job_dir / "job.json").read_bytes()
    env = dict(os.environ, PYTHONPATH=repo_on_path(REPO), MUSUBI_DEVICE="cpu")
    probe = ("import sys, runpy; sys.argv = ['musubi'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('musubi.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
             "print('torch imported:', 'torch' in sys.modules); sys.exit(code)")
    res = subprocess.run([sys.executable, "-c", probe, "train", str(job), "--out", str(tmp_path / "r"), "--resume"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "already finished" in res.stdout and "torch imported: False" in res.stdout
    assert (job_dir / "job.json").read_bytes() == before and not (job_dir / "logs").exists()


def test_config_errors_come_before_torch(tiny_job, tmp_path: Path) -> None:
    """A missing file, a bad key in the file and a bad --set: exit 2, one line, torch never imported."""
    env = dict(os.environ, PYTHONPATH=repo_on_path(REPO))
    probe = ("import sys, runpy; sys.argv = ['musubi'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('musubi.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "print('torch imported:', 'torch' in sys.modules); sys.exit(code)")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**yaml.safe_load(tiny_job().read_text()), "trian": {}}), encoding="utf-8")
    for args, words in ((["nofile.yaml"], "no such file"), ([str(bad)], "unknown key trian"),
                        ([str(tiny_job()), "--set", "train.epocs=3"], "--set train.epocs=3: unknown key")):
        res = subprocess.run([sys.executable, "-c", probe, "train", *args], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=120)
        assert res.returncode == 2 and words in res.stderr + res.stdout, res.stderr + res.stdout
        assert "torch imported: False" in res.stdout


def test_set_errors_name_the_flag_not_the_file(tiny_job) -> None:
    code, out = run(str(tiny_job()), "--set", "train.epocs=3")
    line = one_line_error(out)
    assert code == 2 and line.startswith("error: --set train.epocs=3: unknown key train.epocs; did you mean 'epochs'")
    # a bad key written in the file still names the file
    job = tiny_job(train={"epocs": 3})
    code, out = run(str(job), "--set", "train.lr=0.2")
    assert code == 2 and one_line_error(out).startswith(f"error: {job}: unknown key train.epocs")
