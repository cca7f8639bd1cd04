"""bench/overlap_contention.py runs end to end: one process (copy beside a GEMM) and two gloo ranks under torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "overlap_contention.py"
TINY = ("--device", "cpu", "--size", "48", "--mib", "0.5", "--seconds", "0.2")


def _check(data: dict[str, object], mode: str, world: int) -> None:
    assert data["mode"] == mode and data["world"] == world and data["card"] == "cpu"
    for key in ("gemm_tflops_alone", "gemm_tflops_with_comm", "comm_gbps_alone", "comm_gbps_with_gemm"):
        assert float(data[key]) > 0, key  # type: ignore[arg-type]
    assert data["gemm_slowdown"] == pytest.approx(
        float(data["gemm_tflops_alone"]) / float(data["gemm_tflops_with_comm"]) - 1)  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_copy_mode_writes_the_three_measurements(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--mode", "copy", *TINY, "--out", str(out)],
                          capture_output=True, text=True, timeout=110, check=False)
    assert done.returncode == 0, done.stderr[-500:]
    _check(json.loads(out.read_text()), "copy", 1)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_nccl_mode_under_torchrun_with_two_gloo_ranks(tmp_path: Path) -> None:
    out = tmp_path / "n.json"
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--nproc-per-node", "2", str(SCRIPT), "--mode", "nccl", *TINY,
                           "--out", str(out)], capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-800:]
    _check(json.loads(out.read_text()), "nccl", 2)


def test_bad_options_are_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--seconds", "0"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1
