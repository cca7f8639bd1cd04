"""`success:` — what "scaled" means for a run, written down before it starts and checked by it.

Used by the fleet YAML (criteria over every job) and the job YAML (criteria over that job).
A criterion whose evidence a run cannot have (GPU utilisation on CPU ranks, a speedup without a
single-GPU baseline) is reported as not measured, never as met.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SuccessSpec(BaseModel):
    """Thresholds the run checks itself against at the end (RUN/checklist.json, exit code)."""

    # Strict like every config model (config.job.StrictModel; not imported: job.py imports this module).
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    min_gpu_util: float | None = Field(
        0.8, ge=0, le=1, description="Mean GPU utilisation after warm-up, per GPU used (telemetry; GPU runs only).")
    max_data_wait: float | None = Field(
        0.1, ge=0, le=1, description="Largest share of step time spent waiting for data, per job (telemetry).")
    min_speedup: float | None = Field(
        None, gt=0, description="Measured speedup of each distributed job over its own single-GPU baseline.")
    min_scaling_efficiency: float | None = Field(
        None, gt=0, le=1.5, description="Speedup divided by GPUs, per distributed job (needs a baseline).")
    min_score: float | None = Field(
        None, description="Fleet: the best leaderboard score; job: its headline metric (e.g. map50, top1).")
    max_failures: int = Field(0, ge=0, le=10000, description="Jobs allowed to end failed (after their retries).")
    max_throughput_drop: float | None = Field(
        0.10, ge=0, le=1, description="Allowed drop of a job's throughput against earlier runs of the same job "
        "on the same machine (median samples/s).")
    baseline_steps: int = Field(
        0, ge=0, le=10000, description="Measure each distributed job's single-GPU baseline over this many steps "
        "before the fleet (0: no baseline, speedup criteria not measured; the later half of the steps counts, so "
        "give 50 or more on GPUs). Cached per job and machine.")
