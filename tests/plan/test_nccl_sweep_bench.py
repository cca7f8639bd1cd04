"""bench/nccl_sweep.py: its size grid and nccl-tests' bus factors, and one run under torchrun with two gloo ranks."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "nccl_sweep.py"


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("nccl_sweep", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sizes_go_by_four_and_keep_both_ends() -> None:
    sweep = _module()
    assert sweep.sizes_bytes(64, 1) == [65536, 262144, 1048576]
    assert sweep.sizes_bytes(1, 0.01)[-1] == int(0.01 * 2**20)
    with pytest.raises(ValueError):
        sweep.sizes_bytes(4096, 1)  # min above max


def test_bus_factors_are_nccl_tests() -> None:
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n (all-gather, reduce-scatter)."""
    sweep = _module()
    assert sweep.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert sweep.bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert sweep.bus_factor("reduce_scatter", 2) == pytest.approx(0.5)


def test_prediction_tends_to_the_tiers_busbw_for_large_messages() -> None:
    """At 1 GiB the planner's time is the bus-bandwidth term: busbw from it is the catalog's NVLink x 0.8."""
    sweep = _module()
    from musubi.plan.catalog import get_gpu

    gib = 2**30
    t = sweep.predicted_s("all_reduce", gib, 2, "H200")
    busbw = gib / t * sweep.bus_factor("all_reduce", 2)
    assert busbw == pytest.approx(get_gpu("H200").nvlink_gbps * 1e9 * 0.8, rel=0.01)
    # a small call costs the framework's measured floor (Efficiency.call_s), not the bytes
    assert sweep.predicted_s("all_gather", 1024, 2, "H200") == pytest.approx(44e-6, rel=0.01)


def test_refuses_to_run_outside_torchrun() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu"], capture_output=True, text=True,
                          timeout=60, check=False, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "torchrun" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sweep_under_torchrun_with_two_gloo_ranks(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--nproc-per-node", "2", str(SCRIPT), "--device", "cpu", "--gpu", "H200",
                           "--min-kib", "4", "--max-mib", "0.0625", "--warmup", "1", "--iters", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-800:]
    data = json.loads(out.read_text())
    assert data["world"] == 2 and data["card"] == "cpu"
    assert {r["collective"] for r in data["rows"]} == {"all_reduce", "all_gather", "reduce_scatter"}
    assert len(data["rows"]) == 3 * 3  # 4, 16, 64 KiB
    for r in data["rows"]:
        assert r["seconds"] > 0 and r["predicted_s"] > 0
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * _module().bus_factor(r["collective"], 2))
