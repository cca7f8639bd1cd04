"""The fleet's own sampler of an external command's GPUs: what GPU sharing decides by.

A Musubi task job samples its GPU itself (telemetry/sampler.py, one sampler per rank). An external command has
no such sampler, so its GPU utilisation and peak memory were never measured and it could never share a GPU
(fleet/sharing.py), not even a small detector that keeps an H200 a fifth busy. The fleet knows which GPUs it gave
the command, so NVML's readings of those GPUs while the command trains are the command's own whenever it held
them alone, and only such a run enters the history (LocalFleet._remember skips a run that shared its GPU).

The samples go where a task job's sampler writes them (JOB/telemetry/, kind "sample" with gpu_index), so
durations.record_run, the report and the checklist read them the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import psutil

from musubi.contract.run_files import RUN_FILES
from musubi.telemetry.sampler import NvmlDevice, Sampler, open_nvml_index

log = logging.getLogger("musubi.fleet")

#: Samples a second: telemetry.sample_hz's default for task jobs.
SAMPLE_HZ = 2.0


def watch_command(job_dir: Path, pid: int, gpus: list[int],
                  open_device: Callable[[int], NvmlDevice | None] = open_nvml_index,
                  hz: float = SAMPLE_HZ) -> list[Sampler]:
    """Start sampling each of `gpus` (NVML indices) and process `pid` into JOB/telemetry/sampler-gpu{i}.jsonl;
    none when NVML sees no GPU or the process has already ended."""
    samplers: list[Sampler] = []
    for k, gpu in enumerate(gpus):
        device = open_device(gpu)
        if device is None:
            continue
        folder = job_dir / RUN_FILES.telemetry
        folder.mkdir(parents=True, exist_ok=True)
        try:
            samplers.append(Sampler(folder / f"sampler-gpu{gpu}.jsonl", k, hz, device, pid=pid))
        except psutil.Error as e:  # ended before its first sample: nothing to measure
            log.info("GPU %s of pid %s not sampled: %s", gpu, pid, e)
    return samplers


def stop_watching(samplers: list[Sampler]) -> None:
    """Stop the samplers of a command that has ended (no last sample: its GPUs idle now)."""
    for s in samplers:
        s.close(last_sample=False)
