"""The file names of a run directory, spelled once (see DESIGN.md's run-directory layout).

Here, in the lowest layer, so every package can name them: the planner reads a job's metrics,
the topology reader labels env.json, `musubi/store/rundir.py` writes and reads them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunFiles:
    """RUN/ holds run, env, fleet, leaderboard, checklist, preflight; RUN/JOB/ the job's own files."""

    run: str = "run.json"  # what was asked: resolved config, who/when, versions
    env: str = "env.json"  # provenance: host, GPUs, CUDA, torch, NCCL, data set hash
    fleet: str = "fleet.json"  # the fleet's job states
    leaderboard: str = "leaderboard.json"  # one row per job: metrics, fps, score, rank
    checklist: str = "checklist.json"  # the run's evidence checklist
    preflight: str = "preflight.json"  # the preflight report
    job: str = "job.json"  # resolved job config, status, attempts, failure causes
    metrics: str = "metrics.jsonl"  # rank 0's scalar metrics per step/epoch
    summary: str = "summary.json"  # the trainer's end-of-run summary
    eval: str = "eval.json"  # validation metrics, FPS and how it was measured
    goodput: str = "goodput.json"  # productive vs lost time over the attempts
    metrics_from: str = "metrics_from.json"  # an external job's declared metrics adapter (fleet.CommandJob)
    startup: str = "startup.jsonl"  # start-up marks of every process of the job (store/startup.py)


#: The one instance every module names files through: `job_dir / RUN_FILES.job`.
RUN_FILES = RunFiles()
