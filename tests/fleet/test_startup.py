"""Start-up marks to components, the gate a job waits at, and the report's fleet section."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from musubi.diagnose.fleet_view import fleet_section
from musubi.store.startup import EVAL_START, components, mark, marks_of, summary_line
from musubi.worker.rank import wait_for_gate
from tests.conftest import write_tiny_job

MARKS = {"spawned": 100.0, "launcher": 102.0, "worker": 103.5, "imported": 106.0, "world": 107.0, "gate": 109.0,
         "batch": 109.1, "model": 110.0, "fit": 110.0, "first_step": 112.0, "trained": 150.0, "train_exit": 151.0,
         "eval_spawned": 113.0, "eval_ready": 120.0, "evaluated": 154.0}


def test_components_split_the_start_up_and_the_tail() -> None:
    c = components(MARKS)
    assert c["python + CLI import"] == 2.0 and c["torchrun agent"] == 1.5 and c["rank import (python, torch)"] == 2.5
    assert c["rendezvous + process group"] == 1.0 and c["waiting for the GPU (overlapped)"] == 2.0
    assert c["first step"] == 2.0 and c["to first step"] == 12.0
    assert c["start-up on the GPUs"] == 3.0  # from the gate: the rest overlapped the previous job's evaluation
    # the evaluation step was ready before training ended: its start costs nothing on the critical path
    assert c[EVAL_START] == 0.0 and c["evaluation"] == 3.0 and c["teardown"] == 1.0
    late = components({**MARKS, "eval_ready": 155.0, "evaluated": 158.0})
    assert late[EVAL_START] == 4.0 and late["evaluation"] == 3.0
    no_gate = components({k: v for k, v in MARKS.items() if k != "gate"})
    assert no_gate["start-up on the GPUs"] == no_gate["to first step"] == 12.0
    assert "12.0 s to the first step (3.0 s of it on the GPUs)" in summary_line(c)


def test_the_first_step_in_parts_where_the_worker_marked_them(tmp_path: Path) -> None:
    """batch, forward, backward, the rest: beside the components, summing to the whole first step."""
    c = components({**MARKS, "first_batch": 110.5, "first_forward": 111.2, "first_backward": 111.7})
    parts = [c["first step: batch"], c["first step: forward"], c["first step: backward"],
             c["first step: optimizer and the rest"]]
    assert parts == [0.5, 0.7, 0.5, 0.3] and abs(sum(parts) - c["first step"]) < 1e-9
    assert c["to first step"] == 12.0  # unchanged: the parts are inside the first step
    assert "(first step: batch 0.5, forward 0.7, backward 0.5, optimizer and the rest 0.3)" in summary_line(c)
    assert not any(k.startswith("first step:") for k in components(MARKS))  # older runs: no parts


def test_the_evaluation_step_in_parts_where_it_marked_them() -> None:
    """model load, FPS, export, the rest: inside "evaluation", from the later of ready and training's end."""
    c = components({**MARKS, "eval_loaded": 152.2, "eval_fps": 153.1, "eval_exported": 153.8})
    parts = [c["evaluation: model load"], c["evaluation: FPS"], c["evaluation: export"], c["evaluation: the rest"]]
    assert [round(p, 3) for p in parts] == [1.2, 0.9, 0.7, 0.2] and abs(sum(parts) - c["evaluation"]) < 1e-9
    # Not exported (no early export asked, or it did not rank): "the rest" runs from the FPS mark.
    plain = components({**MARKS, "eval_loaded": 152.2, "eval_fps": 153.1})
    assert "evaluation: export" not in plain and round(plain["evaluation: the rest"], 3) == 0.9
    # Started after training ended: its parts run from its own start, not from the end of training.
    late = components({**MARKS, "eval_ready": 155.0, "eval_loaded": 156.0, "eval_fps": 157.5, "evaluated": 158.0})
    assert late["evaluation: model load"] == 1.0 and late["evaluation"] == 3.0
    assert "(model load 1.2, FPS 0.9, export 0.7, the rest 0.2)" in summary_line(c)
    assert not any(k.startswith("evaluation:") for k in components(MARKS))  # older runs: no parts


def test_the_launcher_in_parts_where_musubi_train_marked_them() -> None:
    """python and imports, the job's checks, preflight and records, the rest: inside "python + CLI import"."""
    c = components({**MARKS, "entered": 100.6, "admitted": 101.1, "prepared": 101.7})
    parts = [c["launcher: python, imports"], c["launcher: job checks"], c["launcher: preflight, run records"],
             c["launcher: pinning, torchrun command"]]
    assert [round(p, 3) for p in parts] == [0.6, 0.5, 0.6, 0.3] and abs(sum(parts) - c["python + CLI import"]) < 1e-9
    assert c["to first step"] == 12.0  # unchanged: the parts are inside the launcher's component
    assert "(launcher: python, imports 0.6, job checks 0.5, preflight, run records 0.6, pinning, torchrun command " \
           "0.3)" in summary_line(c)
    assert not any(k.startswith("launcher:") for k in components(MARKS))  # older runs: no parts


def test_first_step_marks_once_at_the_first_micro_batch_then_come_off(tmp_path: Path) -> None:
    import torch

    from musubi.worker.step_events import AFTER_BACKWARD, BEFORE_FORWARD, LOSS, FirstStepMarks, StepEvents

    events, after = StepEvents(), []
    FirstStepMarks(tmp_path, torch.device("cpu"), 5).attach(events)
    events.on(AFTER_BACKWARD, after.append)  # attached after the marks, which take themselves off in between
    for step in (5, 5, 6):  # two micro-batches of step 5 (accumulation), then step 6
        events.fire(BEFORE_FORWARD, step, None)
        assert events.pipe(LOSS, torch.tensor(1.0), step) == torch.tensor(1.0)  # the loss passes unchanged
        events.fire(AFTER_BACKWARD, step)
    assert list(marks_of(tmp_path)) == ["first_batch", "first_forward", "first_backward"]
    assert len((tmp_path / "startup.jsonl").read_text().splitlines()) == 3
    assert after == [5, 5, 6]  # the hook after them ran every time, also when they came off


def test_marks_of_one_attempt(tmp_path: Path) -> None:
    mark(tmp_path, "launcher", 10.0)
    mark(tmp_path, "launcher", 50.0)  # the next attempt
    mark(tmp_path, "world", 52.0)
    (tmp_path / "startup.jsonl").open("a").write("{torn\n")
    assert marks_of(tmp_path, since=40.0) == {"launcher": 50.0, "world": 52.0}
    assert marks_of(tmp_path, until=20.0) == {"launcher": 10.0}


def test_gate_waits_for_the_fleet_and_ends_when_the_fleet_is_gone(tmp_path: Path, monkeypatch) -> None:
    gate = tmp_path / "gate"
    monkeypatch.setenv("MUSUBI_GATE", str(gate))
    monkeypatch.setenv("MUSUBI_GATE_PID", str(os.getpid()))
    threading.Timer(0.3, gate.write_text, args=("1",)).start()
    t0 = time.monotonic()
    assert wait_for_gate() is True and time.monotonic() - t0 >= 0.25
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setenv("MUSUBI_GATE", str(tmp_path / "never"))
    monkeypatch.setenv("MUSUBI_GATE_PID", str(gone.pid))
    with pytest.raises(RuntimeError, match="is gone"):
        wait_for_gate()
    monkeypatch.delenv("MUSUBI_GATE")
    assert wait_for_gate() is False


def test_report_draws_one_bar_per_attempt(tmp_path: Path) -> None:
    record = {"fleet": "f", "jobs": {
        "a<b>": {"history": [{"attempt": 1, "gpus": [0], "started": 0.0, "released": 10.0, "ended": 11.0,
                              "outcome": "failed"},
                             {"attempt": 2, "gpus": [0, 1], "started": 20.0, "released": 40.0, "ended": 44.0,
                              "outcome": "done"}],
                 "startup": components(MARKS)},
        "c": {"history": [{"attempt": 1, "gpus": [1], "started": 0.0, "released": 18.0, "ended": 19.0,
                           "outcome": "done"}]}}}
    (tmp_path / "fleet.json").write_text(json.dumps(record))
    html = fleet_section(tmp_path)
    assert html.count("<title>a&lt;b&gt; 0-10 s</title>") == 1
    assert html.count("<title>a&lt;b&gt;#1 20-40 s</title>") == 2  # the retry on 2 GPUs: a bar in each lane
    assert html.count("<title>a&lt;b&gt;#1 evaluation 40-44 s</title>") == 2  # its tail after the release
    assert "3 attempt(s) on 2 GPU(s), 44 s" in html and "<b>" not in html and ">GPU 1</text>" in html
    assert "Start-up per job" in html and "rank import (python, torch)" in html
    assert fleet_section(tmp_path / "nothing") == ""


def test_a_fleet_members_launcher_imports_no_torch(tmp_path: Path) -> None:
    """The fleet checked its jobs before starting any and placed them on their GPUs: a member's `musubi train`
    neither builds the model on the meta device again nor counts the GPUs, so it never imports torch (2.4-2.7 s
    of its 2.8-s launcher on 2 cores); a lone `musubi train` still does both."""
    job = write_tiny_job(tmp_path)

    def imports_torch(member: bool, device: str) -> bool:  # a member runs with --no-check (fleet/jobs.py)
        code = ("import sys; from pathlib import Path; from musubi.launch.checks import admit; "
                "from musubi.launch.request import TrainRequest; "
                f"admit(TrainRequest(job_path=Path({str(job)!r}), nproc=2, device={device!r}, "
                f"out=Path({str(tmp_path / device)!r}), fleet_member={member}, check={not member})); "
                "print('torch' in sys.modules)")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        return res.stdout.strip().splitlines()[-1] == "True"

    assert not imports_torch(True, "cuda")  # placed by the fleet: no GPU count, no torch, on this CPU machine too
    assert imports_torch(False, "cpu")  # alone: the task's checks build the model (torch)


def test_an_external_jobs_evaluation_step_imports_no_torch_and_records_what_evaluate_job_does(tmp_path: Path) -> None:
    """The fleet runs `eval_step --external` for a command job: its eval.json is read and validated as
    evaluate_job would, without importing torch and torchvision up front (~5 s of CPU a job on 2 cores); a bad
    eval.json is still refused (exit 2) and a missing one is still the contract's error (exit 3)."""
    from musubi.contract.exits import EXIT_CONFIG, EXIT_NO_RESULTS
    from musubi.evaluate.job_eval import evaluate_job

    def step(job: Path, *flags: str) -> tuple[int, str, bool]:
        code = ("import sys; from musubi.fleet import eval_step; "
                f"rc = eval_step.main([*{list(flags)!r}, {str(job)!r}]); print('torch' in sys.modules); sys.exit(rc)")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return res.returncode, res.stderr, res.stdout.strip().splitlines()[-1] == "True"

    reported = {"metrics": {"top1": 0.5}, "primary_metric": "top1", "fps": {"fps": 12.0}}
    ext, ref = tmp_path / "ext", tmp_path / "ref"
    for d in (ext, ref):
        d.mkdir()
        (d / "eval.json").write_text(json.dumps(reported))
    code, err, torch_seen = step(ext, "--external")
    assert code == 0 and not torch_seen, err[-2000:]
    ours, theirs = json.loads((ext / "eval.json").read_text()), evaluate_job(ref)
    assert {k: v for k, v in ours.items() if k != "evaluated"} == {k: v for k, v in theirs.items() if k != "evaluated"}
    (ext / "eval.json").write_text(json.dumps({"metrics": {"top1": "high"}}))
    code, err, _ = step(ext, "--external")
    assert code == EXIT_CONFIG and "error:" in err, err[-2000:]
    (ext / "eval.json").unlink()
    code, err, _ = step(ext, "--external")
    assert code == EXIT_NO_RESULTS and "exited 0 without writing it" in err, err[-2000:]
    assert step(ext, "--external", "--after")[0] == EXIT_CONFIG  # a flag without its value: usage, not a guess


def test_a_resume_refused_for_a_live_run_imports_no_torch(tmp_path: Path) -> None:
    """`musubi run --resume` on a folder a live run holds is refused before the executors (torch) are imported:
    the refusal cost 5.8 s of CPU (the executor's name read through fleet/slurm.py), now ~0.5 s."""
    from musubi.fleet.stop import run_lock

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("name: f\njobs:\n- {name: a, command: [job.py]}\n")
    (tmp_path / "job.py").write_text("")
    run = tmp_path / "run"
    run.mkdir()
    (run / "fleet.json").write_text(json.dumps({"executor": "local", "jobs": {}}))
    code = ("import sys; from pathlib import Path; from musubi.contract.errors import ConfigError; "
            "from musubi.fleet.run import FleetRequest, run_fleet\n"
            f"try: run_fleet(FleetRequest(fleet_path=Path({str(fleet)!r}), out=Path({str(run)!r}), resume=True, "
            "check=False, device='cpu', cpu_slots=1))\n"
            "except ConfigError as e: print(e)\n"
            "print('torch' in sys.modules)")
    with run_lock(run):  # this process is the live run
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    said, torch_seen = res.stdout.strip().splitlines()[-2:]
    assert "is in use by a live `musubi run`" in said and torch_seen == "False", res.stdout


def test_a_fleet_of_external_commands_imports_no_torch_and_records_torchs_build(tmp_path: Path) -> None:
    """`musubi run` of external commands only: no torch in its process (its env.json read torch's version and CUDA
    build from torch/version.py, the checkpoint markers are read by committed.py): 19.6 s wall and 5.7 s of CPU
    for two one-line jobs before, 3.1 and 1.2 s after on 2 cores. env.json says what torch itself says."""
    import torch

    (tmp_path / "job.py").write_text("import json, os, pathlib\nd = pathlib.Path(os.environ['MUSUBI_JOB_DIR'])\n"
                                     "(d / 'eval.json').write_text(json.dumps({'metrics': {'top1': 0.5}, "
                                     "'primary_metric': 'top1'}))\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("name: ext\njobs:\n- {name: a, command: [job.py]}\n- {name: b, command: [job.py]}\n")
    run = tmp_path / "run"
    code = ("import runpy, sys; sys.argv = ['musubi', 'run', sys.argv[1], '--out', sys.argv[2], '--device', 'cpu', "
            "'--cpu-slots', '2', '--no-check']\n"
            "try:\n    runpy.run_module('musubi.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('torch imported:', 'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code, str(fleet), str(run)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.stdout.strip().splitlines()[-1] == "torch imported: False", res.stdout[-2000:] + res.stderr[-2000:]
    jobs = json.loads((run / "fleet.json").read_text())["jobs"]
    assert {n: j["state"] for n, j in jobs.items()} == {"a": "done", "b": "done"}, jobs
    env = json.loads((run / "env.json").read_text())
    assert (env["torch"], env["cuda"]) == (torch.__version__, torch.version.cuda), env


def test_the_fleets_own_start_up_in_parts() -> None:
    """`musubi run` marks its start-up (fleet/run.py FLEET_STARTUP): each part runs from the previous mark
    present (from the interpreter's start), and "in all" to the last."""
    from musubi.fleet.run import startup_parts

    marks = {"process": 100.0, "entered": 100.8, "imported": 103.0, "checked": 104.5, "recorded": 104.7,
             "planned": 104.75}
    assert startup_parts(marks) == {"python + CLI import": 0.8, "fleet imports (torch)": 2.2, "job checks": 1.5,
                                    "run records": 0.2, "executor set-up (history, topology)": 0.05, "in all": 4.75}
    assert startup_parts({"entered": 1.0, "imported": 2.0}) == {"fleet imports (torch)": 1.0}  # no process start


def test_counting_gpus_and_recording_the_machine_never_start_the_cuda_driver(monkeypatch) -> None:
    """The launcher and the fleet count GPUs (and env.json records them) without torch.cuda.is_available(), which
    starts the CUDA driver (cudaGetDeviceCount) in a process that never runs a kernel: torch's device_count()
    asks NVML first."""
    import torch

    from musubi.store.rundir import env_record
    from musubi.topology import visible
    from musubi.topology.visible import visible_gpus

    def driver_start() -> bool:
        raise AssertionError("torch.cuda.is_available() starts the CUDA driver")

    monkeypatch.setattr(torch.cuda, "is_available", driver_start)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    # A driver NVML cannot read (a container without the library): torch's count, never is_available().
    monkeypatch.setattr(visible, "driver_present", lambda: True)
    monkeypatch.setattr(visible, "nvml_count", lambda: None)
    assert visible_gpus() == 2
    # NVML's count with CUDA_VISIBLE_DEVICES applied, no torch asked.
    monkeypatch.setattr(visible, "nvml_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "device_count", driver_start)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpus() == 2
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    rec = env_record()
    assert "nccl" in rec and rec["torch"] == torch.__version__
    from musubi.store.provenance import cudnn_number

    # cuDNN from its wheel in torch's numbering (torch.backends.cudnn.version() would start CUDA to check the GPUs)
    assert (cudnn_number("9.13.0.50"), cudnn_number("8.9.7.29"), cudnn_number("dev")) == ("91300", "8907", None)
