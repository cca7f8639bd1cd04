"""The names of a run directory's files and folders, spelled once (see DESIGN.md's run-directory layout).

Here, in the contract, so every process and package names them alike: a rank writes its log,
exit record and heartbeat where the launcher, the fleet and the report read them. A folder inside
another is named with its parent (`logs/exits`), so `job_dir / RUN_FILES.exits` is the whole path.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunFiles:
    """RUN/ holds run, env, fleet, leaderboard, checklist, preflight; RUN/JOB/ the job's own files and folders."""

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
    cadence: str = "cadence.jsonl"  # checkpoint.every_steps auto: each interval chosen, its inputs and saves measured
    metrics_from: str = "metrics_from.json"  # an external job's declared metrics adapter (fleet.CommandJob)
    startup: str = "startup.jsonl"  # start-up marks of every process of the job (store/startup.py)
    onnx: str = "model.onnx"  # the exported graph: RUN/JOB/export/ (built-in) or RUN/JOB/ (an external job's)
    export_record: str = "export.json"  # how the graph was exported and checked, beside it
    registered: str = "registered.json"  # RUN/JOB/export/: the registry's row, to rebuild musubi.db from
    applied: str = "applied.json"  # RUN/JOB/numerics/: the precision fallback in force
    trained: str = "trained.json"  # RUN/JOB/logs/: the fleet's marker that training finished
    torchrun_log: str = "torchrun.log"  # RUN/JOB/logs/: the torchrun agent's output (a node's: torchrun.nodeN.log)
    fleet_log: str = "fleet.log"  # RUN/ (the fleet's) and RUN/JOB/logs/ (a task job's launcher output)
    stdout_log: str = "stdout.log"  # RUN/JOB/logs/: an external job's output

    # Folders of RUN/JOB/ (no dot in a folder's name; a test tells files and folders apart by it).
    logs: str = "logs"  # rank{r}.log, per-rank error files, the launcher's log
    exits: str = "logs/exits"  # each rank's exit record a{attempt}-rank{r}.json (contract/records.py)
    hangs: str = "logs/hang"  # the watchdog's hang reports hang-a{attempt}.json
    inject: str = "logs/inject"  # marks of the injected faults that fired (once per run)
    checkpoints: str = "checkpoints"  # step-000123/ with DCP shards and a COMMITTED marker
    quarantine: str = "quarantine"  # inside the checkpoint folder: checkpoints written after a non-finite loss
    telemetry: str = "telemetry"  # rank{r}.jsonl spans, gpu{i}.jsonl NVML samples
    memory: str = "memory"  # OOM records and the back-off in force (recovery/memory.py)
    progress: str = "progress"  # per-attempt progress lines a{attempt}.jsonl (goodput)
    heartbeat: str = "heartbeat"  # each rank's heartbeat a{attempt}-rank{r}.json (watchdog, goodput)
    numerics: str = "numerics"  # non-finite loss records and the precision fallback
    export: str = "export"  # model.onnx and its records
    tensorboard: str = "tensorboard"  # rank 0's TensorBoard events
    # Folders of RUN/.
    baselines: str = "baselines"  # one reference per job to compare a re-run against
    mlruns: str = "mlruns"  # MLflow's store when no tracking URI is given

    def rank_log(self, rank: int) -> str:
        """A rank's own log file inside logs/."""
        return f"rank{rank}.log"


#: The one instance every module names files through: `job_dir / RUN_FILES.job`.
RUN_FILES = RunFiles()
