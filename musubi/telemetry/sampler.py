"""Hardware sampler thread: this rank's GPU through NVML, its process and loader workers through psutil.

Per sample (1-10 Hz): GPU utilisation, SM activity from the GPM API where the
GPU offers it (Hopper and later; plain "utilisation" reads 100 % while one tiny
kernel runs), memory, power, SM/memory clocks, temperature and clock-event
(throttle) reasons; CPU of this process, of its data-loader workers, and of the
host. Without NVML (CPU runs, no driver) only the CPU figures are written. Each
NVML query that fails is left out of the sample, never fatal.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil

from musubi.telemetry.writer import TelemetryWriter

log = logging.getLogger("musubi.telemetry")

#: Clock-event reason bits worth naming (NVML's nvmlClocksEventReason*).
THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal",
    0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}


def throttle_names(mask: int) -> list[str]:
    """Names of the set clock-event reason bits (idle excluded: not a slowdown)."""
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit and name != "gpu_idle"]


#: One NVML caller at a time in this process. The fleet (and bench/fleet.py's parallel (a)) watch several external
#: commands' GPUs from threads of one process; on the GPU machine (torch 2.11, nvidia-ml-py) two threads
#: starting their watches at the same moment (nvmlInit, the GPM support query, the first samples) killed the
#: process with a segmentation fault, twice; with this lock the same start ran without one. A sample
#: is a handful of NVML queries per GPU at 2 Hz, so callers rarely wait (not timed).
NVML_LOCK = threading.RLock()


class NvmlDevice:
    """One GPU seen through NVML (located by UUID so CUDA_VISIBLE_DEVICES cannot mislead it)."""

    def __init__(self, nvml: Any, handle: Any, index: int) -> None:
        self.nvml, self.h, self.index = nvml, handle, index
        self._gpm_prev = None
        try:
            with NVML_LOCK:
                self.gpm = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except Exception:  # older driver or binding: no GPM
            self.gpm = False

    def _q(self, out: dict[str, Any], key: str, fn: Any, scale: float = 1.0) -> None:
        try:
            v = fn()
        except Exception:
            return
        out[key] = round(v * scale, 3) if isinstance(v, float) or scale != 1.0 else v

    def read(self) -> dict[str, Any]:
        """One sample of this GPU."""
        with NVML_LOCK:
            return self._read()

    def _read(self) -> dict[str, Any]:
        n, h = self.nvml, self.h
        out: dict[str, Any] = {"gpu_index": self.index}
        try:
            u = n.nvmlDeviceGetUtilizationRates(h)
            out["util"], out["mem_util"] = u.gpu, u.memory
        except Exception:
            pass
        try:
            m = n.nvmlDeviceGetMemoryInfo(h)
            out["mem_used_gib"], out["mem_total_gib"] = round(m.used / 2**30, 3), round(m.total / 2**30, 3)
        except Exception:
            pass
        self._q(out, "power_w", lambda: n.nvmlDeviceGetPowerUsage(h), 1e-3)
        self._q(out, "sm_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
        self._q(out, "mem_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM))
        self._q(out, "temp_c", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
        try:
            mask = n.nvmlDeviceGetCurrentClocksEventReasons(h)
        except Exception:
            try:
                mask = n.nvmlDeviceGetCurrentClocksThrottleReasons(h)
            except Exception:
                mask = None
        if mask is not None:
            out["throttle"] = throttle_names(int(mask))
        if self.gpm:
            sm = self._gpm_sm_activity()
            if sm is not None:
                out["sm_active"] = sm
        return out

    def processes(self) -> list[tuple[int, int]] | None:
        """(pid, bytes of GPU memory) of every compute process on this GPU; None when NVML cannot list them."""
        with NVML_LOCK:
            try:
                procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.h)
            except Exception:
                return None
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            # NVML reports "not available" as a huge sentinel (or None in some bindings): no size then
            out.append((int(p.pid), int(used) if isinstance(used, int) and 0 <= used < 2**48 else 0))
        return out

    def _gpm_sm_activity(self) -> float | None:
        """SM activity (%) between this and the previous GPM sample."""
        n = self.nvml
        try:
            cur = n.nvmlGpmSampleAlloc()
            n.nvmlGpmSampleGet(self.h, cur)
        except Exception:
            self.gpm = False
            return None
        prev, self._gpm_prev = self._gpm_prev, cur
        if prev is None:
            return None
        try:
            mg = n.c_nvmlGpmMetricsGet_t()
            mg.version = n.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 1
            mg.sample1, mg.sample2 = prev, cur
            mg.metrics[0].metricId = n.NVML_GPM_METRIC_SM_UTIL
            n.nvmlGpmMetricsGet(mg)
            if mg.metrics[0].nvmlReturn != 0:  # this metric unsupported on this GPU
                self.gpm = False
                return None
            return round(float(mg.metrics[0].value), 2)
        except Exception:
            self.gpm = False
            return None
        finally:
            try:
                n.nvmlGpmSampleFree(prev)
            except Exception:
                pass


def open_nvml_device(cuda_index: int | None) -> NvmlDevice | None:
    """NVML's view of CUDA device `cuda_index` (None: CPU run, or no NVML)."""
    if cuda_index is None:
        return None
    with NVML_LOCK:
        return _open_cuda_index(cuda_index)


def _open_cuda_index(cuda_index: int) -> NvmlDevice | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    handle, index = None, cuda_index
    try:
        import torch

        uuid = str(getattr(torch.cuda.get_device_properties(cuda_index), "uuid", "") or "")
        if uuid:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                if str(pynvml.nvmlDeviceGetUUID(h)).removeprefix("GPU-") == uuid.removeprefix("GPU-"):
                    handle, index = h, i
                    break
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
    except Exception as e:
        log.info("NVML sees no GPU for cuda:%s (%s): CPU figures only", cuda_index, e)
        return None
    return NvmlDevice(pynvml, handle, index)


def open_nvml_index(index: int) -> NvmlDevice | None:
    """NVML's GPU `index` without torch (the fleet numbers its GPUs as NVML does and hands them to jobs as
    CUDA_VISIBLE_DEVICES); None: no NVML or no such GPU."""
    try:
        import pynvml

        with NVML_LOCK:
            pynvml.nvmlInit()
            return NvmlDevice(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index), index)
    except Exception as e:  # no driver, no binding, or an index NVML does not know
        log.info("NVML sees no GPU %s (%s): CPU figures only", index, e)
        return None


FIRST_SAMPLE_S = 0.2  # the first sample, after start
MAX_FAILURES = 10  # failed samples in a row after which the sampler stops
#: The rank's process tree is scanned (every pid on the machine read) at most this often; a child started
#: since (DCP's checkpoint process at the first save) is counted from the next scan. A loader worker the
#: feed names that no scan has seen brings the next scan forward, but not sooner than MIN_RESCAN_S after the
#: last (a worker pid that is not a child must not make every sample scan).
RESCAN_S = 10.0
MIN_RESCAN_S = 1.0


class Sampler:
    """A daemon thread writing one sample per period to `path`: of this process, or of process `pid` (the
    fleet watching an external command, which has no sampler of its own)."""

    def __init__(self, path: Path, rank: int, hz: float, device: NvmlDevice | None,
                 worker_pids: Callable[[], Iterable[int]] | None = None, pid: int | None = None) -> None:
        self.rank, self.period, self.device = rank, 1.0 / hz, device
        # The data loader's worker processes; None: every child process counts as a worker.
        self.worker_pids = worker_pids
        self.proc = psutil.Process(pid)
        self.proc.cpu_percent(None)  # the first call only starts the measurement
        psutil.cpu_percent(None)
        # This rank's own cores when it is pinned (its MUSUBI_CPUS set): how busy they are, whoever keeps them
        # busy, is the evidence of CPU contention that proc_cpu and workers_cpu (its own use) cannot give.
        # Not pinned, its "cores" are the machine's, shared with the other ranks: nothing to attribute.
        mine = sorted(os.sched_getaffinity(pid or 0)) if hasattr(os, "sched_getaffinity") else []
        self.cores = mine if len(mine) < (psutil.cpu_count() or 0) else []
        psutil.cpu_percent(None, percpu=True)
        self._children: dict[int, psutil.Process] = {}
        self._last_scan = float("-inf")  # time.monotonic() of the last scan of the process tree
        self._failures = 0  # failed samples in a row
        self.writer = TelemetryWriter(path)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"musubi-sampler-rank{rank}", daemon=True)
        self._thread.start()

    def _scan(self) -> set[int]:
        """Read the rank's process tree: drop the children gone, add the new ones (their CPU measurement starts
        now); the pids added."""
        self._last_scan = time.monotonic()
        try:
            kids = {k.pid: k for k in self.proc.children(recursive=True)}
        except psutil.Error:
            return set()
        for pid in [p for p in self._children if p not in kids]:
            del self._children[pid]
        added = set(kids) - set(self._children)
        for pid in added:
            self._children[pid] = kids[pid]
            try:
                kids[pid].cpu_percent(None)
            except psutil.Error:
                pass
        return added

    def _children_cpu(self, named: set[int]) -> dict[int, float]:
        """CPU % of each child process of this rank (0 at the first sight of a child); `named`: the loader's
        workers now.

        Finding the children means reading every process's /proc/PID/stat (psutil's children(): a Python loop
        over all the machine's pids, kernel threads included; the more processes on the host, the longer),
        time the training thread may wait for the GIL. So the tree is scanned every RESCAN_S, or sooner (not
        before MIN_RESCAN_S) when the loader names a worker not seen yet; between scans only the known children
        are read."""
        since = time.monotonic() - self._last_scan
        unseen = bool(named - set(self._children))
        added = self._scan() if since >= RESCAN_S or (unseen and since >= MIN_RESCAN_S) else set()
        cpu: dict[int, float] = {}
        for pid, p in list(self._children.items()):
            if pid in added:
                cpu[pid] = 0.0
                continue
            try:
                cpu[pid] = p.cpu_percent(None)
            except psutil.Error:  # ended since the last scan
                del self._children[pid]
        return cpu

    def _workers_cpu(self) -> tuple[float, int, float, int]:
        """CPU % summed and count of the loader's workers, then of the other children (DCP's checkpoint
        process, compile workers): only the workers are evidence of the input pipeline's load."""
        named: set[int] = set()
        if self.worker_pids is not None:
            try:
                named = set(self.worker_pids())
            except Exception:  # the loader between epochs
                named = set()
        cpu = self._children_cpu(named)
        if self.worker_pids is None:
            return round(sum(cpu.values()), 1), len(cpu), 0.0, 0
        workers = [v for pid, v in cpu.items() if pid in named]
        others = [v for pid, v in cpu.items() if pid not in named]
        return round(sum(workers), 1), len(workers), round(sum(others), 1), len(others)

    def _gpu_others(self) -> tuple[int, int] | None:
        """Processes on this rank's GPU that are not the rank or its children (count, MiB): another job, a
        notebook left open, a co-tenant the fleet placed. It takes GPU time from every kernel and collective of
        the rank, which the job feels in full and the rank's own work only in part, possibly under the
        straggler bar (BENCHMARKS.md, telemetry). NVML lists the host's pids: inside a container (another pid
        namespace) the rank's pid is not among them, and the process with the most memory is taken as the rank."""
        assert self.device is not None
        procs = self.device.processes()
        if procs is None:
            return None
        mine = {self.proc.pid, *self._children}
        if procs and not any(pid in mine for pid, _ in procs):
            procs = sorted(procs, key=lambda p: -p[1])[1:]
        others = [(pid, used) for pid, used in procs if pid not in mine]
        return len(others), round(sum(used for _, used in others) / 2**20)

    def sample(self) -> dict[str, Any]:
        """One record: time, CPU figures, the GPU's when there is one, and what the sample cost this thread."""
        t_cpu = time.thread_time()
        workers, n, others, n_others = self._workers_cpu()
        rec: dict[str, Any] = {
            "kind": "sample", "rank": self.rank, "t": round(time.time(), 3),
            "workers_cpu": workers, "workers": n, "host_cpu": psutil.cpu_percent(None),
        }
        try:
            rec["proc_cpu"] = self.proc.cpu_percent(None)
        except psutil.Error:  # a watched process (pid) that has just ended: its GPU is still worth a sample
            pass
        per_core = psutil.cpu_percent(None, percpu=True)
        mine = [per_core[c] for c in self.cores if c < len(per_core)]
        if mine:
            rec["cores_cpu"], rec["cores"] = round(sum(mine) / len(mine), 1), len(mine)
        if n_others:
            rec["other_children_cpu"], rec["other_children"] = others, n_others
        try:
            rec["rss_gib"] = round(self.proc.memory_info().rss / 2**30, 3)
        except psutil.Error:
            pass
        if self.device is not None:
            rec.update(self.device.read())
            others = self._gpu_others()
            if others is not None:
                rec["gpu_others"], rec["gpu_others_mib"] = others
        # The sampler's own CPU time for this record (mostly holding the GIL the training thread also needs):
        # telemetry's cost, measured where it runs.
        rec["self_ms"] = round((time.thread_time() - t_cpu) * 1e3, 3)
        return rec

    def _run(self) -> None:
        # The first sample soon after start (CPU figures need a short interval to mean anything), then one
        # per period: a run of a few seconds still gets several points.
        wait = min(self.period, FIRST_SAMPLE_S)
        while not self._stop.wait(wait):
            wait = self.period
            self._sample_once()
            if self._failures >= MAX_FAILURES:
                log.warning("sampler stopped after %d failed samples in a row", self._failures)
                return

    def _sample_once(self) -> None:
        try:
            self.writer.put(self.sample())
            self._failures = 0
        except Exception as e:  # a sampler never ends a run; one failed read does not end the sampler
            self._failures += 1
            if self._failures == 1:
                log.warning("sampler: a sample failed (%s); going on", e)

    def close(self, last_sample: bool = True) -> None:
        """Stop sampling, take a last sample (the end of the run is on the plots; `last_sample` False: a
        watched process that has ended, whose GPU now idles), and flush."""
        self._stop.set()
        self._thread.join(5)
        if last_sample and not self._thread.is_alive() and self._failures < MAX_FAILURES:
            self._sample_once()
        self.writer.close()
