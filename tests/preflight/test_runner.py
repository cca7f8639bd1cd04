"""run_checks on a crafted machine: the input layer answers with crafted readings, every check runs for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from musubi.preflight import runner
from musubi.preflight.readings import TopologyReading
from musubi.preflight.result import Status

from .crafted import RTX5090, gpu, nvml, stack

FOUR = nvml(gpu(0), gpu(1), gpu(2, ecc_uncorrected=1), gpu(3))


def _machine(monkeypatch: pytest.MonkeyPatch, machine, torch_stack, cvd: str | None) -> None:
    monkeypatch.setattr(runner, "read_nvml", lambda: (machine, TopologyReading()))
    monkeypatch.setattr(runner, "read_topo_smi", lambda: TopologyReading())
    monkeypatch.setattr(runner, "read_stack", lambda nv, torch_read=None: torch_stack)
    if cvd is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)


def statuses(report) -> dict[str, Status]:
    return {r.check: r.status for r in report.results}


def test_requested_gpus_are_the_ones_judged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _machine(monkeypatch, FOUR, stack(), None)
    report = runner.run_checks([0, 1], [], tmp_path, None, comm=False)
    assert report.readings["in_use"] == [0, 1] and report.readings["mode"] == "gpu"
    assert not report.failed  # GPU 2's ECC errors do not matter to a run on 0,1
    report = runner.run_checks([1, 2], [], tmp_path, None, comm=False)
    assert statuses(report)["gpus.ecc"] is Status.FAIL and report.failed


def test_default_is_what_cuda_visible_devices_exposes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _machine(monkeypatch, FOUR, stack(), "3,1")
    report = runner.run_checks(None, [], tmp_path, None, comm=False)
    assert report.readings["in_use"] == [3, 1] and not report.failed


def test_blackwell_on_an_old_build_fails_the_whole_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    old = stack(torch_version="2.5.1+cu124", cuda_version="12.4", arch_list=("sm_80", "sm_86", "sm_90"))
    _machine(monkeypatch, nvml(gpu(0, RTX5090)), old, None)
    report = runner.run_checks([0], [], tmp_path, None, comm=False)
    fails = [r for r in report.failed if r.check == "stack.arch"]
    assert fails and fails[0].fix == "upgrade to a torch build with sm_120 (CUDA >= 12.8)"
    assert '"stack.arch"' in report.to_json()
