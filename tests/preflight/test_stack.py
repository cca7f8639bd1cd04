"""Stack checks on crafted builds and drivers: kernels for every GPU, a driver that runs torch's CUDA, NCCL."""

from __future__ import annotations

from musubi.preflight.checks.stack import arch_coverage, check_stack
from musubi.preflight.result import Status

from .crafted import RTX5090, V100, gpu, only, stack

OLD_BUILD = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")


def test_blackwell_on_a_build_without_sm120_fails_with_the_upgrade() -> None:
    s = stack(torch_version="2.3.0+cu121", cuda_version="12.1", arch_list=OLD_BUILD, driver_version="570.124.06")
    r = only(check_stack(s, [gpu(0, RTX5090), gpu(1, RTX5090)], requested=True), "stack.arch")
    assert r.status is Status.FAIL
    assert "has kernels for sm_50..sm_90" in r.found and "GPUs 0,1 (NVIDIA GeForce RTX 5090) are sm_120" in r.found
    assert r.fix == "upgrade to a torch build with sm_120 (CUDA >= 12.8)"


def test_volta_on_a_cuda13_build_fails_naming_the_dropped_arch() -> None:
    r = only(check_stack(stack(), [gpu(0, V100)], requested=True), "stack.arch")
    assert r.status is Status.FAIL and "GPU 0 (Tesla V100-SXM2-32GB) is sm_70" in r.found
    assert "still ships sm_70 (a CUDA 12.x wheel" in r.fix and "CUDA 13 dropped it" in r.fix


def test_ptx_only_coverage_warns_about_jit() -> None:
    s = stack(arch_list=("sm_80", "sm_90", "compute_90"))
    r = only(check_stack(s, [gpu(0, RTX5090)], requested=True), "stack.arch")
    assert r.status is Status.WARN and "only PTX, JIT-compiled at start" in r.found
    assert r.fix == "upgrade to a torch build with sm_120 (CUDA >= 12.8)"


def test_arch_rules_same_major_newer_minor_and_arch_specific() -> None:
    assert arch_coverage((8, 6), ("sm_80",)) == "sass"  # sm_80 code runs on sm_86
    assert arch_coverage((8, 0), ("sm_86",)) is None  # not the other way round
    assert arch_coverage((9, 0), ("sm_90a",)) == "sass"
    assert arch_coverage((10, 3), ("sm_100a",)) is None  # 'a' targets only their exact arch
    assert arch_coverage((12, 0), ("sm_100",)) is None  # another major
    assert arch_coverage((12, 0), ("compute_90",)) == "ptx"


def test_cpu_only_torch_with_gpus_requested_fails() -> None:
    s = stack(torch_version="2.14.1+cpu", cuda_version=None, arch_list=(), cuda_available=False)
    r = only(check_stack(s, [gpu(0)], requested=True))
    assert (r.check, r.status) == ("stack.cuda", Status.FAIL)
    assert "torch 2.14.1+cpu is a CPU-only build; GPU 0 (NVIDIA H100 80GB HBM3) present" == r.found
    assert r.fix.startswith("install a CUDA build of torch from https://download.pytorch.org/whl/")


def test_cpu_only_torch_with_gpus_present_but_not_requested_warns() -> None:
    s = stack(torch_version="2.14.1+cpu", cuda_version=None, arch_list=(), cuda_available=False)
    r = only(check_stack(s, [gpu(0)], requested=False))
    assert r.status is Status.WARN and r.fix.endswith("(until then training runs on CPU ranks)")


def test_driver_below_the_cuda_major_floor_fails() -> None:
    s = stack(cuda_version="12.8", driver_version="470.82.01", driver_cuda_version="11.4")
    r = only(check_stack(s, [gpu(0)], requested=True), "stack.driver")
    assert r.status is Status.FAIL
    assert r.found == ("driver 470.82.01 (natively CUDA 11.4) is too old for torch's CUDA 12.8 "
                       "(CUDA 12.x needs >= 525.60.13)")
    assert r.fix == "upgrade the NVIDIA driver to >= 570.26"


def test_driver_on_minor_version_compatibility_warns() -> None:
    s = stack(cuda_version="12.8", driver_version="550.54.15", driver_cuda_version="12.4")
    r = only(check_stack(s, [gpu(0)], requested=True), "stack.driver")
    assert r.status is Status.WARN and "minor-version compatibility" in r.found
    assert r.fix == "upgrade the NVIDIA driver to >= 570.26"


def test_cuda_that_does_not_initialise_fails_with_torchs_reason() -> None:
    s = stack(cuda_available=False, arch_list=(), cuda_error="CUDA initialization: CUDA driver is too old")
    r = only(check_stack(s, [gpu(0)], requested=True), "stack.cuda")
    assert r.status is Status.FAIL and r.found == "torch cannot initialise CUDA: CUDA initialization: CUDA driver is too old"


def test_no_nccl_fails_for_gpu_runs() -> None:
    r = only(check_stack(stack(nccl_available=False, nccl_version=None), [gpu(0), gpu(1)], True), "stack.nccl")
    assert r.status is Status.FAIL and "has no NCCL: GPU ranks cannot all-reduce" in r.found


def test_cpu_ranks_pass_on_gloo_and_fail_without_it() -> None:
    ok = only(check_stack(stack(cuda_available=False), [], requested=False))
    assert ok.status is Status.PASS and ok.found.endswith("no GPU in use: CPU ranks on gloo")
    bad = only(check_stack(stack(gloo_available=False), [], requested=False))
    assert (bad.check, bad.status) == ("stack.gloo", Status.FAIL)


def test_a_healthy_stack_passes_in_one_line() -> None:
    r = only(check_stack(stack(), [gpu(0), gpu(1)], requested=True))
    assert r.status is Status.PASS and "kernels for sm_90" in r.found and "NCCL 2.27.7" in r.found
