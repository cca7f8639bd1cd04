"""run_checks: take every reading, run every check, collect the report (the one entry point of preflight)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from musubi.preflight.checks.binding import CVD, check_binding, resolve_visible
from musubi.preflight.checks.comm import check_comm
from musubi.preflight.checks.data import check_data
from musubi.preflight.checks.disk import check_disk
from musubi.preflight.checks.environment import check_env
from musubi.preflight.checks.gpus import check_gpus
from musubi.preflight.checks.stack import check_stack
from musubi.preflight.read.comm import CommProbe
from musubi.preflight.read.data import read_data
from musubi.preflight.read.machine import read_disk, read_env, read_stack
from musubi.preflight.read.topology import read_topo_smi
from musubi.preflight.readings import CommReading
from musubi.preflight.result import CheckResult, PreflightReport, warn
from musubi.topology.nvml import read_nvml
from musubi.topology.read import with_sysfs_places

#: Default run-directory parent (as `musubi train` uses when --out is not given).
DEFAULT_RUNS = Path("runs")
#: Checkpoints a job keeps by default (checkpoint.keep_last).
DEFAULT_KEEP = 3


def run_checks(
    gpus: list[int] | None,
    data_paths: list[str],
    out_dir: Path | None,
    ckpt_bytes: int | None,
    comm: bool = True,
    *,
    keep_checkpoints: int = DEFAULT_KEEP,
    cpu_ranks: int = 2,
    comm_timeout_s: float = 90.0,
    torch_read: dict | None = None,
) -> PreflightReport:
    """Check machine, stack, GPUs, binding, communication, disk, data and environment before a run.

    `gpus`: nvidia-smi indices to use, None for every visible GPU (CPU ranks if there is none),
    [] for CPU ranks. `ckpt_bytes`: one checkpoint's size, if known (see checkpoint_bytes_estimate).
    `torch_read`: torch's part of the stack reading taken by another process (read_stack), so that this one
    need not import torch (`musubi train`'s launcher: its warm spare read it).
    """
    t0 = time.perf_counter()
    nvml, topo = read_nvml()
    requested = gpus if gpus else None  # [] means CPU ranks: nothing was asked of the GPUs
    present = {g.index for g in nvml.gpus}

    def pick(visible_now: list[int]) -> tuple[list[int], list]:
        in_use_ = visible_now if gpus is None else [i for i in dict.fromkeys(gpus) if i in present]
        # A GPU NVML cannot read has no model or capability to judge: the GPU check reports it.
        return in_use_, [g for g in nvml.gpus if g.index in in_use_ and g.error is None]

    # The NCCL probe is the slowest reading (a process, torch, CUDA and NCCL init): start it as soon
    # as NVML has shown the GPUs, before torch is even imported here; cancelled if the stack says
    # GPUs cannot be used after all. GPU processes were listed (NVML) before it began.
    probe: CommProbe | None = None
    if comm and nvml.available and gpus != []:
        in_use, used = pick(resolve_visible(os.environ.get(CVD), nvml.gpus).indices)
        if len(used) > 1 and len(used) == len(in_use):
            probe = CommProbe("nccl", len(used), ",".join(g.uuid for g in used), timeout_s=comm_timeout_s)
    try:
        if len(nvml.gpus) > 1 and not topo.links:
            topo = read_topo_smi()
        # The same model env.json keeps (musubi.topology): NUMA node and CPUs of each GPU where NVML gave links.
        topo = with_sysfs_places(nvml, topo)
        stack = read_stack(nvml, torch_read)
    except BaseException:
        if probe is not None:
            probe.cancel()
        raise
    visible = resolve_visible(os.environ.get(CVD), nvml.gpus,
                              count=None if nvml.available else stack.cuda_device_count)
    in_use, used = pick(visible.indices)
    gpu_run = (bool(used) and len(used) == len(in_use) and stack.cuda_available and stack.cuda_version is not None
               and stack.nccl_available)
    usable = gpu_run or not requested
    ranks = len(used) if gpu_run else cpu_ranks

    if probe is not None and not (gpu_run and probe.ranks == len(used)):
        probe.cancel()  # the stack cannot drive these GPUs: the stack check says why
        probe = None
    if probe is None and comm and usable and (not gpu_run or len(used) > 1):
        probe = CommProbe("nccl" if gpu_run else "gloo", ranks,
                          ",".join(g.uuid for g in used) if gpu_run else None, timeout_s=comm_timeout_s)
    try:
        env = read_env(ranks, nvml)
        disk = read_disk(out_dir if out_dir is not None else DEFAULT_RUNS)
        data = [read_data(p) for p in data_paths]
        comm_reading: CommReading | None = probe.result() if probe is not None else None
    except BaseException:
        if probe is not None:
            probe.cancel()
        raise

    results: list[CheckResult] = []
    results += check_stack(stack, used, requested is not None)
    results += check_gpus(nvml, requested, in_use, own_pids={os.getpid()})
    results += check_binding(requested, visible, len(nvml.gpus))
    if usable:
        results += check_comm(comm_reading, topo, used if gpu_run else [], env.variables)
    else:
        results.append(warn("comm", "all-reduce test not run: the GPUs asked for are not usable",
                            "fix the FAIL lines above first"))
    results += check_disk(disk, ckpt_bytes, keep_checkpoints)
    results += check_data(data)
    results += check_env(env)
    readings = {"requested": gpus, "in_use": in_use, "mode": "gpu" if gpu_run else "cpu", "stack": stack,
                "nvml": nvml, "topology": topo, "visible": visible, "comm": comm_reading, "disk": disk,
                "data": data, "env": env}
    return PreflightReport(results=results, seconds=time.perf_counter() - t0, readings=readings)
