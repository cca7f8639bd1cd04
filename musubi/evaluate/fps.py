"""FPS by one documented protocol, for torch models and ONNX files.

Protocol: batch 1; the job's fixed input (one real validation sample at the
job's image_size / seq_len, already on the device); `warmup` untimed runs;
then `runs` timed runs, each bracketed by perf_counter and, on CUDA, by
torch.cuda.synchronize (kernels are asynchronous: without the sync we would
time the launch, not the work). FPS = 1000 / median ms (the median ignores
one-off stalls); p90 is reported beside it. fp32, eval mode, no autograd.
Only the model's forward is timed: data loading and the host-to-device copy of
the input are not (ONNX Runtime's CUDA provider does include that copy, as a
deployed session would). The runtime is named: torch-cuda, torch-cpu,
onnxruntime-cuda or onnxruntime-cpu. On the CPU every job is timed at the same
CPU_FPS_THREADS intra-op threads, stated in the record: timed with the cores a fleet
pinned each job to, jobs were compared at different thread counts.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from musubi.contract.errors import ConfigError
from musubi.evaluate.model_io import JobModel, sample_batch

#: (warm-up, timed runs) by device type: a GPU run costs milliseconds, a CPU detector ~0.1 s.
DEFAULT_RUNS: dict[str, tuple[int, int]] = {"cuda": (10, 100), "cpu": (3, 10)}

#: Intra-op threads of every CPU timing (torch and ONNX Runtime), the same for every job so that their CPU FPS
#: compare. One: a fleet gives each job's evaluation at least one core of its own (its slots' cores), and more
#: threads than a job's cores would time the crowding, not the model.
CPU_FPS_THREADS = 1

PROTOCOL = (
    "batch 1, fixed input (one real validation sample at the job's input size), {warmup} untimed warm-up runs, "
    "{runs} timed runs (perf_counter, CUDA synchronized before and after each), fps = 1000 / median ms, fp32, "
    "forward only (input already on the device for torch)"
)


def resolve_device(device: str | None) -> torch.device:
    """`cuda`, `cuda:N` or `cpu`; None: the first visible GPU if any, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device {device!r}: not a device; use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {device!r}: FPS is measured on cpu or cuda only")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r}: no GPU is visible here; use --device cpu")
    return dev


def cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    """Human name of the device that ran the timing (GPU model or CPU model)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def run_counts(device: torch.device, warmup: int | None, runs: int | None) -> tuple[int, int]:
    """Warm-up and timed runs: the given ones, else the device type's defaults."""
    default_warmup, default_runs = DEFAULT_RUNS["cuda" if device.type == "cuda" else "cpu"]
    warmup = default_warmup if warmup is None else warmup
    runs = default_runs if runs is None else runs
    if warmup < 0 or runs < 1:
        raise ConfigError(f"fps: warm-up {warmup} and runs {runs}: need warm-up >= 0 and runs >= 1")
    return warmup, runs


def time_runs(fn: Callable[[], Any], warmup: int, runs: int, sync: Callable[[], None] | None = None) -> list[float]:
    """Milliseconds of each of `runs` timed calls of `fn`, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def summarise(times_ms: list[float], warmup: int) -> dict[str, Any]:
    """fps (from the median), median/p90/min/mean ms, and the counts, of a list of timings."""
    ordered = sorted(times_ms)
    median = statistics.median(ordered)
    # Nearest-rank p90: an observed time, defined for any number of runs.
    p90 = ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]
    return {
        "fps": 1000.0 / median if median > 0 else float("inf"),
        "median_ms": median,
        "p90_ms": p90,
        "min_ms": ordered[0],
        "mean_ms": statistics.fmean(ordered),
        "runs": len(ordered),
        "warmup": warmup,
        "batch": 1,
    }


@contextmanager
def timing_threads(device: torch.device) -> Iterator[int | None]:
    """torch's intra-op threads set to CPU_FPS_THREADS while timing on the CPU (restored after); yields the
    count in force (None on a GPU, where it does not shape the figure)."""
    if device.type != "cpu":
        yield None
        return
    before = torch.get_num_threads()
    torch.set_num_threads(CPU_FPS_THREADS)
    try:
        yield CPU_FPS_THREADS
    finally:
        torch.set_num_threads(before)


def threads_said(threads: int | None) -> str:
    """The protocol's words for a CPU timing's thread count ('' for a GPU one)."""
    return f", {threads} CPU thread{'s' if threads != 1 else ''} (CPU_FPS_THREADS)" if threads else ""


def runtime_versions() -> dict[str, str | None]:
    """torch's and ONNX Runtime's versions (None when ONNX Runtime is missing), recorded with every timing."""
    try:
        import onnxruntime

        ort_version: str | None = onnxruntime.__version__
    except ImportError:
        ort_version = None
    return {"torch": torch.__version__, "onnxruntime": ort_version}


def torch_fps(job: JobModel, device: str | None = None, warmup: int | None = None,
              runs: int | None = None) -> dict[str, Any]:
    """FPS of the job's model through torch on `device`, by the protocol (the model returns to the CPU)."""
    dev = resolve_device(device)
    warmup, runs = run_counts(dev, warmup, runs)
    batch = job.task.to_device(sample_batch(job.task, 1), dev)
    model = job.model.to(dev).eval()
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
    try:
        with torch.inference_mode(), timing_threads(dev) as threads:
            times = time_runs(lambda: job.task.predict(model, batch), warmup, runs, sync)
    finally:
        job.model.to("cpu")
    return {
        **summarise(times, warmup),
        "input_shape": input_shape(batch),
        "device": str(dev),
        "device_name": device_name(dev),
        "runtime": f"torch-{dev.type}",
        "precision": "fp32",
        "threads": threads,
        "protocol": PROTOCOL.format(warmup=warmup, runs=runs) + threads_said(threads),
        **runtime_versions(),
    }


def torchscript_fps(path: Path, sample: np.ndarray | None, shape: list[int], device: str | None = None,
                    warmup: int | None = None, runs: int | None = None) -> dict[str, Any]:
    """FPS of a TorchScript graph (an external framework's export, no framework imported) through torch on
    `device`, by the protocol; `sample`: the fixed input (else uniform random values of `shape`)."""
    dev = resolve_device(device)
    warmup, runs = run_counts(dev, warmup, runs)
    import warnings

    import torchvision  # noqa: F401 - registers torchvision::nms, which a detector's graph may call

    try:
        with warnings.catch_warnings():  # torch.jit.load's deprecation notice: the graph is the framework's choice
            warnings.simplefilter("ignore", FutureWarning)
            model = torch.jit.load(str(path), map_location=dev).eval()
    except Exception as e:  # torch raises its own types for a graph it cannot read
        raise ConfigError(f"{path}: torch cannot load it ({' '.join(str(e).split())[:200]})") from None
    x = torch.from_numpy(sample) if sample is not None else \
        torch.rand(shape, generator=torch.Generator().manual_seed(0))
    x = x.to(dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
    try:
        with torch.inference_mode(), timing_threads(dev) as threads:
            times = time_runs(lambda: model(x), warmup, runs, sync)
    except Exception as e:  # a graph traced for another device, an operator this torch lacks
        raise ConfigError(f"{path}: it does not run on {dev} ({' '.join(str(e).split())[:200]})") from None
    protocol = PROTOCOL.format(warmup=warmup, runs=runs) + threads_said(threads)
    if sample is None:
        protocol = protocol.replace("one real validation sample", "uniform random values")
    return {
        **summarise(times, warmup),
        "input_shape": list(x.shape),
        "device": str(dev),
        "device_name": device_name(dev),
        "runtime": f"torch-{dev.type}",
        "precision": "fp32",
        "threads": threads,
        "protocol": protocol + ", the framework's TorchScript export",
        **runtime_versions(),
    }


def input_shape(batch: Any) -> list[int]:
    """Shape of the model input of a batch: its first tensor (detection: the first image, with batch 1)."""
    first = batch[0] if isinstance(batch, (list, tuple)) else batch
    if isinstance(first, (list, tuple)):  # detection: a list of images [3,H,W]
        return [len(first), *first[0].shape]
    return list(first.shape) if isinstance(first, torch.Tensor) else []


def ort_providers(device: torch.device) -> tuple[list[Any], str]:
    """ONNX Runtime providers for `device` and the runtime's name (CPU when CUDA's provider is missing)."""
    import onnxruntime as ort

    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"], \
            "onnxruntime-cuda"
    return ["CPUExecutionProvider"], "onnxruntime-cpu"


def session_threads() -> int:
    """ONNX Runtime's intra-op threads: the cores this process may run on (a fleet pins each job's evaluation
    to its GPU's cores). Left at 0, ORT starts one thread per physical core of the MACHINE and sets their
    affinity itself, escaping the process's pinning (ORT's threading guide). On a 4-GPU machine one job's
    evaluation step, pinned to its GPU's cores, busied every core of the machine while it exported and timed its
    model, and starved the job training beside it (BENCHMARKS.md, fleet; which library spun the threads was not
    traced; ORT's default is the one documented to do this)."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return max(1, len(cores))


def onnx_session(path: Path, device: torch.device, threads: int | None = None) -> tuple[Any, str]:
    """An inference session on `device` with `threads` intra-op threads (default session_threads()); ConfigError
    naming the file if it cannot be opened."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ConfigError("onnxruntime is not installed; pip install 'musubi-train[eval]'") from None
    providers, runtime = ort_providers(device)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or session_threads()
    options.inter_op_num_threads = 1  # operators in sequence (ORT's default execution mode): no second pool
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=providers), runtime
    except Exception as e:  # ORT raises its own exception types for bad files
        raise ConfigError(f"{path}: ONNX Runtime cannot load it ({' '.join(str(e).split())[:200]})") from None


def random_feeds(session: Any, shape_hint: list[int] | None = None) -> dict[str, np.ndarray]:
    """Inputs for a session with no real sample: uniform [0,1) floats / zeros, batch axis 1.

    A symbolic axis other than the first takes its size from `shape_hint` (the external job's
    declared input shape); without one the input cannot be made.
    """
    feeds = {}
    for k, inp in enumerate(session.get_inputs()):
        shape = []
        for axis, dim in enumerate(inp.shape):
            if isinstance(dim, int) and dim > 0:
                shape.append(dim)
            elif axis == 0:
                shape.append(1)
            elif k == 0 and shape_hint is not None and axis < len(shape_hint):
                shape.append(int(shape_hint[axis]))
            else:
                raise ConfigError(
                    f"input {inp.name!r} has symbolic axis {axis} ({dim}); declare the input shape "
                    "in eval.json as \"input_shape\": [1, 3, H, W]"
                )
        if "float16" in inp.type:
            feeds[inp.name] = np.random.default_rng(0).random(shape).astype(np.float16)
        elif "float" in inp.type:
            feeds[inp.name] = np.random.default_rng(0).random(shape, dtype=np.float32)
        elif "int64" in inp.type:
            feeds[inp.name] = np.zeros(shape, dtype=np.int64)
        elif "int32" in inp.type:
            feeds[inp.name] = np.zeros(shape, dtype=np.int32)
        else:
            raise ConfigError(f"input {inp.name!r} of type {inp.type}: no way to make a sample for it")
    return feeds


def onnx_fps(path: Path, feeds: dict[str, np.ndarray] | None = None, device: str | None = None,
             warmup: int | None = None, runs: int | None = None,
             shape_hint: list[int] | None = None) -> dict[str, Any]:
    """FPS of an ONNX file through ONNX Runtime on `device` (random inputs unless `feeds` are given)."""
    dev = resolve_device(device)
    warmup, runs = run_counts(dev, warmup, runs)
    session, runtime = onnx_session(Path(path), dev, CPU_FPS_THREADS)
    threads = CPU_FPS_THREADS if runtime.endswith("cpu") else None
    real = feeds is not None
    feeds = feeds if feeds is not None else random_feeds(session, shape_hint)
    times = time_runs(lambda: session.run(None, feeds), warmup, runs)  # run() returns host arrays: synchronous
    first = next(iter(feeds.values()))
    used = torch.device("cpu") if runtime.endswith("cpu") else dev
    protocol = PROTOCOL.format(warmup=warmup, runs=runs).replace(
        "forward only (input already on the device for torch)", "session.run with host inputs and outputs"
    ) + threads_said(threads)
    if not real:
        protocol = protocol.replace("one real validation sample", "uniform random values")
    return {
        **summarise(times, warmup),
        "input_shape": list(first.shape),
        "device": str(used),
        "device_name": device_name(used),
        "runtime": runtime,
        "precision": str(first.dtype),
        "threads": threads,
        "protocol": protocol,
        **runtime_versions(),
    }
