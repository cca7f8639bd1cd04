"""The FPS protocol: statistics, run counts, torch and ONNX Runtime timings on tiny models (CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from musubi.contract.errors import ConfigError
from musubi.evaluate.fps import (
    onnx_fps,
    onnx_session,
    random_feeds,
    resolve_device,
    run_counts,
    session_threads,
    summarise,
    time_runs,
    torch_fps,
)
from musubi.evaluate.model_io import load_job_model
from tests.evaluate.jobs import TINY_USER, make_task_job, tiny_onnx


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_task_job(tmp_path_factory.mktemp("run"), TINY_USER, steps=2)


def test_summary_statistics_by_hand() -> None:
    s = summarise([5.0, 1.0, 3.0, 2.0, 4.0], warmup=2)
    assert s["median_ms"] == 3.0 and s["fps"] == pytest.approx(1000 / 3)
    assert s["p90_ms"] == 5.0  # nearest rank: ceil(0.9 * 5) = 5th of 5
    assert s["min_ms"] == 1.0 and s["mean_ms"] == 3.0
    assert (s["runs"], s["warmup"], s["batch"]) == (5, 2, 1)
    assert summarise([2.0] * 20, 0)["p90_ms"] == 2.0


def test_time_runs_counts_and_syncs() -> None:
    calls, syncs = [], []
    times = time_runs(lambda: calls.append(1), warmup=3, runs=4, sync=lambda: syncs.append(1))
    assert len(calls) == 7 and len(times) == 4 and len(syncs) == 8  # a sync before and after each timed run
    assert all(t >= 0 for t in times)


def test_run_counts_defaults_and_checks() -> None:
    cpu = torch.device("cpu")
    assert run_counts(cpu, None, None) == (3, 10)
    assert run_counts(torch.device("cuda"), None, None) == (10, 100)
    assert run_counts(cpu, 0, 1) == (0, 1)
    with pytest.raises(ConfigError, match="runs"):
        run_counts(cpu, 1, 0)


def test_device_names_checked() -> None:
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ConfigError, match="not a device"):
        resolve_device("gpu0")
    with pytest.raises(ConfigError, match="cpu or cuda only"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no GPU is visible"):
            resolve_device("cuda")


def test_torch_fps_on_a_tiny_model(tiny_job: Path) -> None:
    job = load_job_model(tiny_job)
    out = torch_fps(job, "cpu", warmup=1, runs=5)
    assert out["runtime"] == "torch-cpu" and out["device"] == "cpu" and out["device_name"]
    assert (out["runs"], out["warmup"], out["batch"]) == (5, 1, 1)
    assert out["input_shape"] == [1, 16]
    assert out["fps"] == pytest.approx(1000 / out["median_ms"])
    assert out["median_ms"] <= out["p90_ms"]
    assert "median" in out["protocol"] and "1 untimed warm-up" in out["protocol"]
    assert out["torch"] == torch.__version__ and out["precision"] == "fp32"
    assert next(job.model.parameters()).device.type == "cpu"


def test_onnx_fps_with_random_inputs(tmp_path: Path) -> None:
    path = tiny_onnx(tmp_path / "m.onnx", features=4)
    out = onnx_fps(path, device="cpu", warmup=1, runs=3)
    assert out["runtime"] == "onnxruntime-cpu" and out["input_shape"] == [1, 4]  # symbolic batch -> 1
    assert out["onnxruntime"] and "uniform random values" in out["protocol"]


def test_symbolic_axes_need_a_declared_shape(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    path = tmp_path / "dyn.onnx"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 4),), str(path), dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch", 1: "features"}})
    session, _ = onnx_session(path, torch.device("cpu"))
    with pytest.raises(ConfigError, match="input_shape"):
        random_feeds(session)
    assert random_feeds(session, [1, 4])["x"].shape == (1, 4)


def test_unreadable_onnx_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="bad.onnx: ONNX Runtime cannot load it"):
        onnx_fps(bad, device="cpu")


def test_onnx_sessions_keep_to_the_cores_the_process_is_pinned_to(tmp_path: Path) -> None:
    """A fleet pins each job's evaluation to its GPU's cores; ONNX Runtime left at its default starts a thread
    per physical core of the machine with affinities of its own (on 4x H200 an export's parity check kept all
    64 cores busy): sessions take as many threads as the process has cores, and ORT's own pool no further.
    In this process, pinned to one core while the session is made and restored after (a child process importing
    torch for it cost 5-7 s of this test's time)."""
    path = tiny_onnx(tmp_path / "m.onnx")
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        session, _ = onnx_session(path, torch.device("cpu"))
        options = session.get_session_options()
        got = (session_threads(), options.intra_op_num_threads, options.inter_op_num_threads)
    finally:
        os.sched_setaffinity(0, before)
    assert got == (1, 1, 1)
    assert os.sched_getaffinity(0) == before


def test_cpu_timings_run_at_one_stated_thread_count() -> None:
    """Every job's CPU FPS at CPU_FPS_THREADS (not the cores its slots pinned), torch's count restored after."""
    import torch

    from musubi.evaluate.fps import CPU_FPS_THREADS, timing_threads

    before = torch.get_num_threads()
    with timing_threads(torch.device("cpu")) as threads:
        assert threads == CPU_FPS_THREADS == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with timing_threads(torch.device("meta")) as threads:  # not a CPU: the count does not shape the figure
        assert threads is None
