"""Real processes: the gloo all-reduce probe under torchrun, the unique-device all-gather, hang diagnostics.

A gloo probe that passes (its reading: exact sums over 2 ranks, 4 MiB, a time and a bandwidth; its PASS line) is
checked on `musubi check`'s own probe in test_command.py: a probe of its own here cost a torchrun of 2 ranks.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from musubi.preflight.checks.comm import check_comm
from musubi.preflight.diagnostics import diagnostic_env
from musubi.preflight.read.comm import CommProbe, probe_launcher
from musubi.preflight.readings import TopologyReading
from musubi.preflight.result import Status
from musubi.worker.devices import DeviceIdentity, shared_device_error

REPO = Path(__file__).resolve().parents[2]


def test_nccl_probe_is_one_process_unless_asked_for_torchrun() -> None:
    assert probe_launcher("nccl", {}) == "single"
    assert probe_launcher("nccl", {"MUSUBI_COMM_PROBE": "torchrun"}) == "torchrun"
    assert probe_launcher("gloo", {"MUSUBI_COMM_PROBE": "single"}) == "torchrun"  # CPU ranks need processes


def test_single_process_nccl_probe_without_gpus_reports_why(tmp_path: Path) -> None:
    # The real --single path on a machine with no GPU: it must fail with its reason, not hang or crash.
    reading = CommProbe("nccl", 2, "", timeout_s=120).result()
    assert reading.launcher == "single" and reading.error is not None and not reading.timed_out
    assert "needs 2 or more visible GPUs, found 0" in reading.error
    assert reading.wall_s is not None and 0 < reading.wall_s < 120
    shutil.rmtree(Path(reading.log_path).parent)


def test_a_probe_that_outlives_its_timeout_is_killed_and_fails() -> None:
    reading = CommProbe("gloo", 2, None, timeout_s=0.5).result()
    assert reading.timed_out and reading.log_path
    shutil.rmtree(Path(reading.log_path).parent)  # kept for the user on failure; not needed here
    r = check_comm(reading, TopologyReading(), [], {})[0]
    assert (r.check, r.status) == ("comm.allreduce", Status.FAIL) and "did not finish in 0 s" in r.found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in {"Z", "X"}  # a zombie is dead, only not yet reaped by whoever adopted it


def test_a_cancelled_probe_leaves_no_rank_behind() -> None:
    probe = CommProbe("gloo", 2, None, timeout_s=60)
    deadline = time.monotonic() + 30
    while len(pid_files := list(probe.dir.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(f.read_text()) for f in pid_files]
    assert len(pids) == 2
    probe.cancel()  # ranks lead their own sessions: killing torchrun alone would orphan them
    time.sleep(0.2)
    assert not [p for p in pids if _alive(p)] and not probe.dir.exists()


def test_unique_devices_on_a_two_rank_gloo_group(tmp_path: Path) -> None:
    """The all-gather over 2 real gloo ranks: fresh processes forked from a server that imported torch once, not
    torchrun's agent and two interpreters each importing it (the call 6.7, 7.3 s before, 2.8, 3.3 s after)."""
    import socket

    import torch.multiprocessing as mp

    from tests.preflight.unique_devices_worker import forked

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed"])
    mp.start_processes(forked, args=(2, port, str(tmp_path)), nprocs=2, start_method="forkserver", join=True)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for s in seen:
        assert s["cpu"] is None and s["distinct"] is None
        assert s["shared"] == ("ranks 0 and 1 share one GPU (NVIDIA H100 GPU-same on node-a, as cuda:0 and cuda:0); "
                               "give each rank its own GPU: check CUDA_VISIBLE_DEVICES (do not override it per rank) "
                               "and --nproc")


def test_same_uuid_on_two_hosts_is_not_shared() -> None:
    ids = [DeviceIdentity(0, "a", "GPU-1"), DeviceIdentity(1, "b", "GPU-1"), DeviceIdentity(2, "a", "GPU-2")]
    assert shared_device_error(ids) is None
    assert "ranks 0 and 3 share one GPU" in (shared_device_error([*ids, DeviceIdentity(3, "a", "GPU-1")]) or "")


def test_diagnostic_env_sets_defaults_and_never_overrides(tmp_path: Path) -> None:
    env = diagnostic_env(tmp_path / "job", base={})
    assert env == {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str((tmp_path / "job" / "logs" / "nccl-trace-rank").absolute()),
    }
    assert (tmp_path / "job" / "logs").is_dir()
    user = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "100", "NCCL_ASYNC_ERROR_HANDLING": "1"}
    kept = diagnostic_env(tmp_path / "job", base=user)
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in kept and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in kept
    assert kept["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
