"""Stopping `musubi run`: every job's process tree ends, jobs are `interrupted` (not failed), RUN/ is locked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from typer.testing import CliRunner

from musubi.cli import app
from tests.support.pythonpath import repo_on_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]

# First attempt: start a grandchild that ignores SIGTERM (it needs the KILL after the grace period), record
# both pids, then wait forever. A later attempt (the --resume) keeps its promise and writes eval.json.
JOB = '''
import json, os, pathlib, signal, subprocess, sys, time
d = pathlib.Path(os.environ["MUSUBI_JOB_DIR"])
if (d / "pids").exists():
    (d / "eval.json").write_text(json.dumps({"metrics": {"top1": 0.5}, "primary_metric": "top1"}))
    sys.exit(0)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
(d / "pids").write_text(f"{os.getpid()} {child.pid}")
time.sleep(600)
'''


def _cli(*args: str, env: dict) -> list[str]:
    return [sys.executable, "-m", "musubi.cli", "run", *args]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigterm_stops_every_job_tree_and_resume_is_locked_out_while_live(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "job.py").write_text(JOB)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "stop", "jobs": [
        {"name": "a", "command": ["job.py"]}, {"name": "b", "command": ["job.py"]}]}))
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=repo_on_path(ROOT), MUSUBI_STOP_GRACE="2")
    base = ["--out", str(out), "--device", "cpu", "--cpu-slots", "2", "--no-check"]
    live = subprocess.Popen(_cli(str(fleet), *base, env=env), env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while not all((out / j / "pids").is_file() for j in "ab"):
            assert live.poll() is None, live.stdout.read()
            assert time.time() < deadline, "the jobs never started"
            time.sleep(0.3)
        time.sleep(0.5)
        pids = [int(x) for j in "ab" for x in (out / j / "pids").read_text().split()]
        # a second launcher on the live run is refused in one line
        second = subprocess.run(_cli(str(fleet), *base, "--resume", env=env), env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "in use by a live `musubi run`" in second.stderr and len(second.stderr.strip().splitlines()) == 1
        live.send_signal(signal.SIGTERM)
        output = live.communicate(timeout=60)[0]
    finally:
        if live.poll() is None:
            live.kill()
    assert live.returncode == 128 + signal.SIGTERM, output
    assert "interrupted" in output and "--resume" in output
    time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], "a job's process outlived `musubi run`"
    jobs = json.loads((out / "fleet.json").read_text())["jobs"]
    assert {n: (s["state"], s["attempts"], s["causes"]) for n, s in jobs.items()} == {
        "a": ("interrupted", 0, []), "b": ("interrupted", 0, [])}
    # --resume after the stop: each job runs once more, and the interruption used no retry. In this process
    # (CliRunner): what is asserted is the record, and a third `musubi run` would import torch again (~5 s of CPU).
    monkeypatch.setenv("MUSUBI_STOP_GRACE", "2")
    res = CliRunner().invoke(app, ["run", str(fleet), *base, "--resume"])
    jobs = json.loads((out / "fleet.json").read_text())["jobs"]
    assert {n: (s["state"], s["attempts"], s["interruptions"]) for n, s in jobs.items()} == {
        "a": ("done", 1, 1), "b": ("done", 1, 1)}, res.output
