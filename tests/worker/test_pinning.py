"""Rank pinning: the launcher's core sets (MUSUBI_CPUS, torchrun flag) and a rank pinning itself, its threads and
its forked loader workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from musubi.config.fleet import CommandJob
from musubi.contract.errors import ConfigError
from musubi.fleet.jobs import command_launch, pin_process
from musubi.launch import pin_plan
from musubi.launch.pin_plan import apply_to_env, plan_pinning
from musubi.topology.cores import Cpu
from musubi.worker.pinning import auto_workers, intra_op_threads, rank_cpus
from tests.support.pythonpath import repo_on_path

from ..topology.recorded import PCIE8, recorded

REPO = Path(__file__).resolve().parents[2]


def two_sockets() -> list[Cpu]:
    return [Cpu(t * 32 + c, c // 16, (c // 16, c % 16)) for t in range(2) for c in range(32)]


def test_gpu_job_gets_the_cores_of_its_gpus_and_the_numa_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pin_plan, "read_cpus", two_sockets)
    monkeypatch.setattr(pin_plan, "numa_binding_supported", lambda: True)
    monkeypatch.setattr(pin_plan, "narrowed", lambda: False)
    plan = plan_pinning(True, "cuda", 2, {"CUDA_VISIBLE_DEVICES": "4,6"}, recorded(PCIE8))
    # split over all 8 GPUs of the machine (a job beside this one gets other cores): 4 cores + siblings each
    assert plan.env == {"MUSUBI_CPUS": "16-19,48-51;24-27,56-59"}
    assert plan.torchrun_args == ["--numa-binding=node"]
    env = apply_to_env(plan, {"OMP_NUM_THREADS": "32"})
    if "OMP_NUM_THREADS" not in os.environ:
        assert env["OMP_NUM_THREADS"] == "8"


def test_lone_job_in_its_own_cpuset_splits_over_its_own_gpus(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(pin_plan, "read_cpus", two_sockets)
    monkeypatch.setattr(pin_plan, "numa_binding_supported", lambda: False)
    monkeypatch.setattr(pin_plan, "narrowed", lambda: False)
    with caplog.at_level("WARNING", logger="musubi.launch"):
        shared = plan_pinning(True, "cuda", 1, {"CUDA_VISIBLE_DEVICES": "0"}, recorded(PCIE8))
    assert shared.env == {"MUSUBI_CPUS": "0-3,32-35"} and "all 8 GPUs of the machine" in shared.note
    assert "8 of the 64 CPUs" in caplog.text  # said, not silent
    monkeypatch.setattr(pin_plan, "narrowed", lambda: True)  # a scheduler gave the job a cpuset of its own
    own = plan_pinning(True, "cuda", 1, {"CUDA_VISIBLE_DEVICES": "0"}, recorded(PCIE8))
    # its GPU's whole node 0 (0-15,32-47) plus node 1, which has no GPU of this job
    assert own.env == {"MUSUBI_CPUS": "0-63"} and "this job's GPUs" in own.note


def test_more_workers_than_pinned_cores_is_said(caplog: pytest.LogCaptureFixture) -> None:
    """Said once: the line comes back to the worker, which logs it (at warning level); nothing logged twice."""
    from types import SimpleNamespace

    import torch

    from musubi.worker.pinning import OVERSUBSCRIBED, Pinning, configure_threads

    before = torch.get_num_threads()
    try:
        spec = SimpleNamespace(data=SimpleNamespace(workers=8))
        with caplog.at_level("DEBUG"):
            line = configure_threads(spec, Pinning((0, 1, 2, 3)))
        assert not caplog.records
        assert f"8 loader workers on 4 pinned core(s) {OVERSUBSCRIBED}" in line and "auto gives 3" in line
        assert "warning" not in configure_threads(SimpleNamespace(data=SimpleNamespace(workers=2)),
                                                  Pinning((0, 1, 2, 3)))
    finally:
        torch.set_num_threads(before)


def test_the_default_loader_workers_fit_the_rank_and_say_so() -> None:
    """Unset data.workers: 2 where the rank has 3+ cores, cores - 1 below (the quickstart's 2 ranks on 2 cores: 0),
    said in the rank's line and never tripping the oversubscription warning; a count written is kept."""
    from types import SimpleNamespace

    import torch

    from musubi.worker.pinning import OVERSUBSCRIBED, Pinning, configure_threads

    before = torch.get_num_threads()
    try:
        for cpus, workers in (((0,), 0), ((0, 1), 1), ((0, 1, 2), 2), (tuple(range(16)), 2)):
            spec = SimpleNamespace(data=SimpleNamespace(workers=None))
            line = configure_threads(spec, Pinning(cpus))
            assert spec.data.workers == workers and OVERSUBSCRIBED not in line, line
            assert f"{workers} loader worker(s)" in line
            assert ("default 2 fitted to" in line) == (workers < 2), line
        line = configure_threads(SimpleNamespace(data=SimpleNamespace(workers=None)), Pinning((5,)))
        assert line == "core 5 (1 core): 1 intra-op thread(s), 0 loader worker(s) (default 2 fitted to 1 core(s); " \
                       "data.workers sets it)", line
        assert configure_threads(SimpleNamespace(data=SimpleNamespace(workers=None)),
                                 Pinning((0, 1, 2, 3))).startswith("cores 0-3 (4 cores): ")
        kept = SimpleNamespace(data=SimpleNamespace(workers=2))
        assert OVERSUBSCRIBED in configure_threads(kept, Pinning((0,))) and kept.data.workers == 2
    finally:
        torch.set_num_threads(before)


def test_given_sets_are_checked_and_off_means_off() -> None:
    assert plan_pinning(True, "cpu", 2, {"MUSUBI_CPUS": "0-3;4-7"}).env == {}
    with pytest.raises(ConfigError, match="gives 1 core set"):
        plan_pinning(True, "cpu", 2, {"MUSUBI_CPUS": "0-3"})
    with pytest.raises(ConfigError, match="core 3 to two ranks"):
        plan_pinning(True, "cpu", 2, {"MUSUBI_CPUS": "0-3;3-5"})
    off = plan_pinning(False, "cuda", 2, {"MUSUBI_CPUS": "0;1"})
    assert off.drop and "MUSUBI_CPUS" not in apply_to_env(off, {"MUSUBI_CPUS": "0;1"})
    assert "UUID" in plan_pinning(True, "cuda", 1, {"CUDA_VISIBLE_DEVICES": "GPU-ab12"}, recorded(PCIE8)).note


def test_thread_counts_follow_the_cores() -> None:
    assert rank_cpus(1, "0-3;4-7") == (4, 5, 6, 7) and rank_cpus(2, "0-3;4-7") is None and rank_cpus(0, "") is None
    assert (auto_workers(8), auto_workers(1), auto_workers(64)) == (7, 0, 16)
    assert (intra_op_threads(8, 7), intra_op_threads(8, 2), intra_op_threads(2, 4)) == (1, 6, 1)


def test_external_command_is_pinned_to_all_cores_of_its_gpus(tmp_path: Path) -> None:
    job = CommandJob(name="ext", command=["true"], gpus=1)
    launch = command_launch(job, tmp_path, [3], "cuda", tmp_path, 4, "8-11")
    assert launch.cpus == (8, 9, 10, 11) and launch.env["MUSUBI_CPUS"] == "8-11"
    if hasattr(os, "sched_setaffinity"):
        cpu = max(os.sched_getaffinity(0))
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            pin_process(proc.pid, (cpu,))
            assert os.sched_getaffinity(proc.pid) == {cpu}
        finally:
            proc.kill()
            proc.wait()


RANK = """
import os, sys, threading, time
early = threading.Thread(target=time.sleep, args=(2,)); early.start()   # a thread that exists before pinning
from musubi.worker.pinning import pin_rank
p = pin_rank(1)
pid = os.fork()
if pid == 0:                                                          # like a data-loader worker
    os._exit(0 if os.sched_getaffinity(0) == {CPU} else 3)
_, status = os.waitpid(pid, 0)
print(p.cpus, sorted(os.sched_getaffinity(early.native_id)), os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and 2 CPUs")
def test_rank_pins_its_threads_and_loader_workers() -> None:
    cpu = max(os.sched_getaffinity(0))
    env = dict(os.environ, MUSUBI_CPUS=f"{min(os.sched_getaffinity(0))};{cpu}", PYTHONPATH=repo_on_path(REPO))
    out = subprocess.run([sys.executable, "-c", RANK.replace("{CPU}", f"{{{cpu}}}")], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split("\n")[0]
    assert out == f"({cpu},) [{cpu}] 0"


def test_bad_core_list_fails_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from musubi.cli import app

    monkeypatch.setenv("MUSUBI_CPUS", "0")
    res = CliRunner().invoke(app, ["train", str(REPO / "examples" / "classify-synthetic.yaml"), "--nproc", "2",
                                   "--device", "cpu", "--out", str(tmp_path / "run"), "--no-check"])
    assert res.exit_code == 2 and "gives 1 core set(s) for 2 ranks" in res.output
    assert not (tmp_path / "run").exists()
