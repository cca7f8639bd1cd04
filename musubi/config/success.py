"""`success:` — what "scaled" means for a run, written down before it starts and checked by it.

Used by the fleet YAML (criteria over every job) and the job YAML (criteria over that job).
A criterion whose evidence a run cannot have (GPU utilisation on CPU ranks, a speedup without a
single-GPU baseline) is reported as not measured, never as met.

Only the thresholds the user wrote are criteria: a default (`min_gpu_util` 0.8, `max_data_wait`
0.1, `max_throughput_drop` 0.10) is still measured and shown, but missing it is a warning (a small
model cannot fill a big GPU, and that is no failure of the run). Which fields were written is
pydantic's `model_fields_set`; a SuccessSpec is recorded (run.json, job.json, a fleet member's
job file) with the written fields only, so reading the record back gives the same set.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

#: How the checklist marks a threshold the user wrote, and one it applied by default.
YOURS, DEFAULT = "yours", "default"


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

    @model_serializer(mode="wrap")
    def _written_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Records keep what the user wrote, not the defaults: read back, the same fields are "set".
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}

    def origin(self, name: str) -> str:
        """YOURS when the user wrote threshold `name` (job, fleet, fleet defaults or --set), else DEFAULT."""
        return YOURS if name in self.model_fields_set else DEFAULT

    def under(self, top: SuccessSpec) -> SuccessSpec:
        """These criteria with the ones written in `top` over them (a fleet's, under a job's own)."""
        return SuccessSpec.model_validate({**self.model_dump(), **top.model_dump()})
