"""GPU checks on crafted NVML readings: presence, memory, other processes, ECC, throttling, Xids, models."""

from __future__ import annotations

from musubi.preflight.checks.gpus import check_gpus
from musubi.preflight.result import Status
from musubi.topology.nvml import ProcessReading

from .crafted import A100, NO_NVML, GiB, gpu, nvml, only


def test_requested_gpu_beyond_the_machine_fails() -> None:
    r = only(check_gpus(nvml(gpu(0), gpu(1), gpu(2), gpu(3)), [2, 5], [2]))
    assert (r.check, r.status) == ("gpus.present", Status.FAIL)
    assert r.found == "--gpu-ids asks for GPU 5; this machine has 4 (0-3)" and r.fix == "pick --gpu-ids from 0-3"


def test_gpus_requested_without_any_gpu_fail_and_cpu_ranks_pass() -> None:
    r = only(check_gpus(NO_NVML, [0], []))
    assert r.status is Status.FAIL
    assert r.found == ("--gpu-ids 0 asks for GPUs but no NVIDIA GPU is reachable "
                       "(NVML: NVML Shared Library Not Found)")
    ok = only(check_gpus(NO_NVML, None, []))
    assert ok.status is Status.PASS and "CPU ranks on gloo (pass --gpu-ids to require GPUs)" in ok.found


def test_foreign_process_holding_most_memory_fails() -> None:
    busy = gpu(1, memory_used=41 * GiB, processes=(ProcessReading(4242, 40 * GiB, "/usr/bin/python3"),))
    r = only(check_gpus(nvml(gpu(0), busy), [0, 1], [0, 1]))
    assert (r.check, r.status) == ("gpus.busy", Status.FAIL)
    assert r.found == "GPU 1: 1 other process(es) hold 40.0 GiB of 79.6 GiB (pid 4242 python3)"
    assert r.fix == "stop them (kill 4242) or pick other --gpu-ids"


def test_foreign_process_holding_a_little_warns() -> None:
    small = gpu(0, memory_used=3 * GiB, processes=(ProcessReading(77, 2 * GiB),))
    r = only(check_gpus(nvml(small), [0], [0]))
    assert r.status is Status.WARN and "hold 2.0 GiB" in r.found


def test_our_own_process_is_not_foreign() -> None:
    mine = gpu(0, processes=(ProcessReading(1234, 1 * GiB),))
    assert only(check_gpus(nvml(mine), [0], [0], own_pids={1234})).status is Status.PASS


def test_memory_used_by_an_invisible_process_warns() -> None:
    r = only(check_gpus(nvml(gpu(0, memory_used=10 * GiB)), [0], [0]))
    assert r.status is Status.WARN and "in use by processes not visible here (another container or user)" in r.found


def test_uncorrected_ecc_errors_fail() -> None:
    r = only(check_gpus(nvml(gpu(0), gpu(1, ecc_uncorrected=3)), [0, 1], [0, 1]))
    assert (r.check, r.status) == ("gpus.ecc", Status.FAIL)
    assert "has 3 uncorrected ECC error(s) since the driver loaded" in r.found and "nvidia-smi -r -i 1" in r.fix


def test_pending_and_failed_row_remaps_fail() -> None:
    pending = only(check_gpus(nvml(gpu(0, remap_pending=True)), [0], [0]))
    assert pending.status is Status.FAIL and "waits for a reset" in pending.found
    failed = only(check_gpus(nvml(gpu(0, remap_failed=True, remap_pending=True)), [0], [0]))
    assert failed.status is Status.FAIL and "remap failed (bad memory)" in failed.found and "RMA" in failed.fix


def test_thermal_throttling_warns_and_idle_reasons_do_not() -> None:
    hot = gpu(2, clock_events=("GpuIdle", "HwThermalSlowdown"))
    r = only(check_gpus(nvml(gpu(0), gpu(1), hot), None, [0, 1, 2]))
    assert (r.check, r.status) == ("gpus.throttle", Status.WARN)
    assert "GPU 2 (NVIDIA H100 80GB HBM3) is throttled now (HwThermalSlowdown)" in r.found
    assert only(check_gpus(nvml(gpu(0, clock_events=("GpuIdle", "SwPowerCap"))), None, [0])).status is Status.PASS


def test_hardware_xid_in_the_kernel_log_warns() -> None:
    r = only(check_gpus(nvml(gpu(0, xids=(13, 79))), [0], [0]))
    assert (r.check, r.status) == ("gpus.xid", Status.WARN)
    assert "logged Xid 79 (GPU fell off the bus) since boot" in r.found  # Xid 13 is the application's


def test_a_partial_memory_report_warns() -> None:
    r = only(check_gpus(nvml(gpu(0, memory_total=40 * GiB)), [0], [0]))
    assert (r.check, r.status) == ("gpus.memory", Status.WARN)
    assert "reports 40.0 GiB, the model has 80 GB: a slice or a memory limit" in r.found


def test_mig_mode_warns() -> None:
    r = only(check_gpus(nvml(gpu(0, mig_enabled=True)), [0], [0]))
    assert r.status is Status.WARN and "has MIG on" in r.found and "-mig 0" in r.fix


def test_mixed_models_warn_naming_the_slowest() -> None:
    r = only(check_gpus(nvml(gpu(0), gpu(1), gpu(2), gpu(3, A100)), None, [0, 1, 2, 3]))
    assert (r.check, r.status) == ("gpus.models", Status.WARN)
    assert "3x NVIDIA H100 80GB HBM3 (0,1,2), 1x NVIDIA A100-SXM4-80GB (3)" in r.found
    assert "the slowest, GPU 3 (NVIDIA A100-SXM4-80GB, ~312 vs 989 TFLOPS)" in r.found
    assert r.fix == "use one model (--gpu-ids 0,1,2) or expect the step time of the slowest"


def test_healthy_gpus_pass_in_one_line() -> None:
    r = only(check_gpus(nvml(gpu(0), gpu(1)), [0, 1], [0, 1]))
    assert r.status is Status.PASS and r.found.startswith("2x NVIDIA H100 80GB HBM3 (GPU 0,1), 79.6 GiB each")
