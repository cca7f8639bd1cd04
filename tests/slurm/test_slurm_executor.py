"""`musubi run --executor slurm` on a real single-node Slurm: jobs, requeue + exact resume, reattach, leaderboard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from musubi.checkpoint.checkpoint import latest_checkpoint
from musubi.cli import app
from musubi.config.load import load_fleet
from musubi.fleet.slurm import batch_script, nice_values, sbatch_options
from tests.conftest import REPO
from tests.support.pythonpath import repo_on_path
from tests.support.runs import final_state

FLEET = {
    "name": "sf",
    "defaults": {"task": "tests.support.tiny_task:make", "model": "mlp",
                 "data": {"synthetic": {"train_size": 192, "val_size": 30}, "workers": 0},
                 "train": {"epochs": 2, "batch": 8, "lr": 0.1, "base_batch": 16, "log_every": 4, "seed": 3,
                           "deterministic": True, "pin_cpus": False},
                 "checkpoint": {"every_steps": 4}, "tracking": {"tensorboard": False}},
    "leaderboard": {"quality_weight": 1.0, "fps_weight": 0.0, "export_top": 0},
    "slurm": {"poll_s": 0.5, "cpus_per_rank": 1},
    "jobs": [{"name": "wide", "gpus": 2, "priority": 5},
             {"name": "narrow", "model_args": {"hidden": 8}, "time_min": 30},
             # an external job that may start only once both trained well (afterok)
             {"name": "summary", "command": ["summary.py"], "after": ["wide", "narrow"]}],
}

SUMMARY = """
import json, os, pathlib
d = pathlib.Path(os.environ["MUSUBI_JOB_DIR"])
done = [(d.parent / j / "summary.json").is_file() for j in ("wide", "narrow")]
(d / "eval.json").write_text(json.dumps({"metrics": {"acc": 0.25 if all(done) else 0.0}, "primary_metric": "acc"}))
"""


def _fleet(tmp_path: Path, wide_on_two_nodes: bool = False) -> Path:
    """The fleet; `wide_on_two_nodes`: its 2-rank job as 2 nodes x 1 rank (the same world, the same numbers)."""
    (tmp_path / "summary.py").write_text(SUMMARY, encoding="utf-8")
    data = json.loads(json.dumps(FLEET))
    if wide_on_two_nodes:
        data["jobs"][0].update(gpus=1, nodes=2)
    p = tmp_path / ("fleet-2n.yaml" if wide_on_two_nodes else "fleet.yaml")
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    return p


def _job(jid: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", jid], capture_output=True, text=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def _musubi_run(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=repo_on_path(REPO), COLUMNS="200")
    return subprocess.Popen([sys.executable, "-m", "musubi.cli", "run", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(cond, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _requeue_and_reattach(out: Path, fleet2n: Path, first: subprocess.Popen) -> tuple[dict[str, str], str]:
    """Requeue the 2-rank job once it committed a checkpoint (what a preemption does), stop `first` (the fleet's
    own process) and reattach with `--resume`; return the jobs' Slurm ids and the reattached run's output."""
    ids = _wait(lambda: (out / "fleet.json").is_file() and all(
        s["scheduler_id"] for s in json.loads((out / "fleet.json").read_text())["jobs"].values()) and {
        n: s["scheduler_id"] for n, s in json.loads((out / "fleet.json").read_text())["jobs"].items()}, 60,
        "both jobs submitted")
    wide = ids["wide"]
    ck = _wait(lambda: latest_checkpoint(out / "wide" / "checkpoints"), 120, "a committed checkpoint of wide")
    assert ck.step > 0
    # Requeue it mid-run and make it eligible at once (Slurm waits 2 min otherwise).
    subprocess.run(["scontrol", "requeue", wide], check=True)
    _wait(lambda: _job(wide).get("JobState") == "PENDING", 30, "wide back in the queue")
    subprocess.run(["scontrol", "update", f"JobId={wide}", "StartTime=now"], check=True)
    # The fleet's own process goes away too; --resume reattaches instead of submitting again.
    os.killpg(first.pid, signal.SIGTERM)
    first.communicate(timeout=30)
    second = _musubi_run(str(fleet2n), "--out", str(out), "--resume")
    text = second.communicate(timeout=300)[0]
    assert second.returncode == 0, text
    return ids, text


def test_sbatch_script_asks_for_the_job(tmp_path: Path) -> None:
    """Nodes, one task per node with its ranks' CPUs, GPUs per node, memory, time, nice, requeue, dependency."""
    data = dict(FLEET, slurm={"partition": "gpu", "contiguous": True, "extra": ["--constraint=h100"]},
                jobs=[{"name": "big", "gpus": 8, "nodes": 4, "host_memory_gib": 64, "time_min": 90},
                      {"name": "small", "priority": 3}])
    p = tmp_path / "f.yaml"
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    spec = load_fleet(p)
    big = spec.jobs[0]
    nice = nice_values(spec)
    assert nice == {"big": 3, "small": 0}
    opts = sbatch_options(big, spec, "cuda", nice["big"], tmp_path / "slurm-%j.log")
    for o in ("--nodes=4", "--ntasks-per-node=1", "--cpus-per-task=32", "--gres=gpu:8", "--mem=65536M",
              "--time=90", "--nice=3", "--requeue", "--partition=gpu", "--contiguous", "--constraint=h100"):
        assert o in opts, o
    cpu = sbatch_options(spec.jobs[1], spec, "cpu", 0, tmp_path / "x")
    assert not any(o.startswith("--gres") for o in cpu) and "--cpus-per-task=4" in cpu
    script = batch_script(opts, tmp_path, "big")
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=musubi.sf.big\n")
    assert "srun --kill-on-bad-exit=1 --ntasks-per-node=1" in script and "musubi.fleet.slurm_node" in script


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fleet_on_slurm_requeues_resumes_and_ranks_like_local(slurm_cluster: float, tmp_path: Path) -> None:
    """The fleet on Slurm with its 2-rank job spread over the 2 Slurm nodes (c10d rendezvous on the first):
    requeued mid-run, `musubi run` stopped and reattached; the same weights and the same leaderboard as the
    same fleet on the local executor (run meanwhile)."""
    fleet = _fleet(tmp_path)
    out = tmp_path / "slurm"
    # Slower batches (no effect on the numbers) leave time to requeue the 2-rank job mid-run.
    os.environ["MUSUBI_INJECT"] = "data_stall:ms=250"
    try:
        first = _musubi_run(str(fleet2n := _fleet(tmp_path, True)), "--out", str(out), "--executor", "slurm",
                            "--device", "cpu")
    finally:
        os.environ.pop("MUSUBI_INJECT")
    # The Slurm side, mostly waiting (for the scheduler, the stalled batches, the requeue), goes on in a thread
    # while the reference, the same fleet on the local executor, runs here (it sets signal handlers: the main
    # thread's); one after the other took 20 s more on the 2-core machine.
    with ThreadPoolExecutor(1) as pool:
        slurm_side = pool.submit(_requeue_and_reattach, out, fleet2n, first)
        res = CliRunner().invoke(app, ["run", str(fleet), "--out", str(tmp_path / "local"), "--device", "cpu",
                                       "--cpu-slots", "3", "--no-check"])
        ids, text = slurm_side.result()
    assert res.exit_code == 0, res.output
    assert "reattached to wide" in text and "submitted" not in text, text
    wide = ids["wide"]

    state = json.loads((out / "fleet.json").read_text())
    assert state["executor"] == "slurm"
    for name, st in state["jobs"].items():
        assert st["state"] == "done" and st["scheduler_id"] == ids[name] and st["scheduler_state"] == "COMPLETED"
        assert Path(st["log"]).is_file() and st["attempts"] == 1
        rec = _job(st["scheduler_id"])  # each job ran as a Slurm job
        assert rec["JobName"] == f"musubi.sf.{name}" and rec["JobState"] == "COMPLETED", rec
    assert _job(wide)["Restarts"] == "1" and _job(wide)["NumNodes"] == "2"
    # the external job waited for both (afterok): it started only after they ended
    assert _job(ids["summary"])["StartTime"] >= max(_job(ids[n])["EndTime"] for n in ("wide", "narrow"))
    log = Path(state["jobs"]["wide"]["log"]).read_text()
    assert "from the start" in log and "resuming from its newest checkpoint" in log, log
    assert "node 0/2: wide" in log and "node 1/2: wide" in log, log
    record = json.loads((out / "wide" / "job.json").read_text())
    assert record["resume"] and record["attempts"] == 2 and record["status"] == "done" and record["nnodes"] == 2
    # exact resume: the requeued job ends with the weights of the uninterrupted local run
    for name in ("wide", "narrow"):
        assert json.loads((out / name / "job.json").read_text())["nproc"] == 1  # per node
        a, b = final_state(tmp_path / "local" / name), final_state(out / name)
        assert set(a) == set(b)
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}: {k} differs from the local executor's run"
    boards = [json.loads((tmp_path / d / "leaderboard.json").read_text())["rows"] for d in ("local", "slurm")]
    assert [r["job"] for r in boards[0]] == [r["job"] for r in boards[1]]
    assert [r["score"] for r in boards[0]] == [r["score"] for r in boards[1]]
    assert {r["job"] for r in boards[1]} == {"wide", "narrow", "summary"}
    assert next(r for r in boards[1] if r["job"] == "summary")["quality"] == 0.25
