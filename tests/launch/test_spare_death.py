"""A launch survives its warm spare's death: the spare SIGKILLed mid-run takes torchrun's agent and the ranks with
it (PR_SET_PDEATHSIG); the launcher tells that from a failure of the job (the agent's client exits
EXIT_SPARE_GONE and the spare ended unasked), relaunches once without a spare from the newest committed checkpoint,
and the job finishes with the weights of a run nobody disturbed (a deterministic job).

One real 2-rank gloo launch whose spare is killed, one undisturbed reference; every assertion shares them. A third
launch, with no restart left (train.max_restarts: 0), fails as before, naming the spare's death.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from musubi.contract.env import MUSUBI_INJECT, MUSUBI_SPARE_SERVER, MUSUBI_WARM_SPARE
from musubi.contract.exits import EXIT_SPARE_GONE
from musubi.launch.spare import WarmSpare, died
from tests.conftest import REPO, write_tiny_job
from tests.support.runs import bitwise_equal, final_state
from tests.support.waiting import wait_for

#: 128 samples / (8 per rank x 2 ranks): 8 steps an epoch, 32 in all; a checkpoint every 8 steps; each batch
#: delayed 100 ms, so the spare dies well before the end (the kill lands within a step of the first checkpoint).
JOB = {"train": {"epochs": 4, "deterministic": True, "max_restarts": 2}, "checkpoint": {"every_steps": 8}}
STALL = "data_stall:ms=100"
FIRST = 8


def musubi_train(job: Path, out: Path) -> subprocess.Popen:
    """`musubi train JOB` on 2 CPU ranks with the warm spare on, every batch stalled, its output piped."""
    env = dict(os.environ, MUSUBI_DEVICE="cpu", CUDA_VISIBLE_DEVICES="", **{MUSUBI_INJECT: STALL})
    env.pop(MUSUBI_WARM_SPARE, None)
    env.pop(MUSUBI_SPARE_SERVER, None)  # the launcher's own spare, its child (test_spare_server.py: a served one)
    return subprocess.Popen([sys.executable, "-m", "musubi.cli", "train", str(job), "--nproc", "2", "--device", "cpu",
                             "--out", str(out), "--no-check"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@dataclass
class Runs:
    """The launch whose spare was killed and the undisturbed reference: exit codes, output, job folders."""

    code: int
    out: str
    job_dir: Path
    spare_pid: int
    reference: Path


def kill_the_spare(job: Path, out: Path) -> tuple[int, str, int]:
    """Launch `job`, SIGKILL its warm spare once step FIRST is committed; (exit code, output, the spare's pid)."""
    proc = musubi_train(job, out)
    try:
        committed = out / "tiny" / "checkpoints" / f"step-{FIRST:09d}" / "COMMITTED"
        assert wait_for(committed.exists, timeout=240), (proc.poll(), proc.stdout and proc.stdout.read())
        (spare,) = [c for c in psutil.Process(proc.pid).children() if "musubi.worker.spare" in c.cmdline()]
        spare.send_signal(signal.SIGKILL)
        text, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    return proc.returncode, text, spare.pid


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    tmp = tmp_path_factory.mktemp("sparedeath")
    job = write_tiny_job(tmp, **JOB)
    code, out, spare_pid = kill_the_spare(job, tmp / "killed")
    ref = musubi_train(job, tmp / "reference")
    ref_out, _ = ref.communicate(timeout=240)
    assert ref.returncode == 0, ref_out
    return Runs(code, out, tmp / "killed" / "tiny", spare_pid, tmp / "reference" / "tiny")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_launch_finishes_and_job_json_names_the_cause(runs: Runs) -> None:
    assert runs.code == 0, runs.out
    record = json.loads((runs.job_dir / "job.json").read_text())
    first, second = record["history"][-2:]
    line = first["error"]
    # The spare died by SIGKILL; the newest committed checkpoint when the launcher looked was step 8 (or a later
    # one the ranks committed before the kill landed): the relaunch resumed from there.
    assert line.startswith("warm spare died (signal 9): relaunched without it, from step "), line
    step = int(line.rsplit(" ", 1)[1])
    assert step >= FIRST and step % FIRST == 0, line
    assert first["status"] == "failed" and first["exit_code"] == EXIT_SPARE_GONE, first
    assert second["status"] == "done" and second["attempt"] == first["attempt"] + 1, second
    assert record["status"] == "done" and record["relaunch"] == line
    assert line in runs.out  # said on the console too
    # The relaunch ran without a spare (the plain path): no agent forked in a second spare's log, ranks resumed.
    rank0 = (runs.job_dir / "logs" / "rank0.log").read_text()
    assert f"resumed from step-{step:09d}: step {step}" in rank0, rank0[-2000:]
    # The records name the cause (no rank could: the agent and the ranks died with the spare).
    from musubi.recovery.goodput import compute_goodput

    failures = compute_goodput(runs.job_dir)["failures"]
    assert [f["cause"] for f in failures] == ["spare died"], failures
    assert failures[0]["detail"] == line


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_weights_equal_an_undisturbed_runs(runs: Runs) -> None:
    assert runs.code == 0, runs.out
    got, want = final_state(runs.job_dir), final_state(runs.reference)
    assert got.keys() == want.keys()
    assert all(bitwise_equal(got[k], want[k]) for k in want), [k for k in want if not bitwise_equal(got[k], want[k])]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_with_no_restart_left_the_launch_fails_naming_the_spares_death(tmp_path: Path) -> None:
    job = write_tiny_job(tmp_path, **{**JOB, "train": {**JOB["train"], "max_restarts": 0}})
    code, out, _ = kill_the_spare(job, tmp_path / "run")
    assert code == 1, out
    record = json.loads((tmp_path / "run" / "tiny" / "job.json").read_text())
    assert record["status"] == "failed" and len(record["history"]) == 1, record["history"]
    line = record["history"][-1]["error"]
    assert line.startswith("warm spare died (signal 9): no restart left (train.max_restarts or the deadline); "
                           "--resume continues from step "), line


def test_only_a_spare_that_ended_under_its_agent_counts_as_dead() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    dead.wait(timeout=60)
    spare = WarmSpare(dead, Path("/nonexistent"))
    assert died(spare, EXIT_SPARE_GONE) == "signal 9"
    assert died(spare, 1) is None  # the agent's own failure: torchrun's exit as before
    assert died(None, EXIT_SPARE_GONE) is None  # no spare: a code of the plain path
