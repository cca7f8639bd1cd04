"""bench/gemm_shapes.py: the shapes it times are the planner's, and it runs end to end (CPU, tiny shapes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gemm_shapes", REPO / "bench" / "gemm_shapes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gemm_shapes"] = module
    spec.loader.exec_module(module)
    return module


def test_layer_gemms_are_the_shapes_the_planner_prices() -> None:
    """GPT-3 175B at TP 8: QKV 12288 -> 3 x 1536 columns, MLP 12288 -> 6144 and back (Megatron's split)."""
    bench = _bench()
    ops = bench.layer_gemms(12288, 96, 96, 49152, 2, 8, 2048)
    assert ops == [("qkv", 2048, 12288, 4608), ("proj", 2048, 1536, 12288), ("mlp_up", 2048, 12288, 6144),
                   ("mlp_down", 2048, 6144, 12288)]
    # Llama 3 70B at TP 8: 8 KV heads, one per TP rank; SwiGLU's gate and up fused
    assert bench.layer_gemms(8192, 64, 8, 28672, 3, 8, 4096)[0] == ("qkv", 4096, 8192, 1024 + 2 * 128)
    assert bench.layer_gemms(8192, 64, 8, 28672, 3, 8, 4096)[2] == ("mlp_up", 4096, 8192, 7168)


def test_it_runs_on_cpu_and_writes_every_section(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    bench = _bench()
    out = tmp_path / "g.json"
    code = bench.main(["--device", "cpu", "--quick", "--sustain-s", "0.2", "--min-s", "0.0005", "--out", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["card"] == "cpu" and data["planner_gpu"] == "H200"
    assert len(data["gemms"]) == 5 and all(r["measured_tflops"] >= 0 and r["planner_tflops"] > 0
                                           for r in data["gemms"])
    assert {r["seq"] for r in data["attention"]} == {64, 128} and data["sustained"]
    assert all(0 < r["planner_tflops"] < 1000 for r in data["attention"] if "error" not in r)


def test_a_bad_gpu_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert _bench().main(["--gpu", "H900", "--device", "cpu"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
