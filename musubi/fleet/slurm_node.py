"""One node of a fleet job inside its Slurm allocation: `srun python -m musubi.fleet.slurm_node RUN JOB`.

Started once per node by the job's sbatch script (fleet/slurm.py). It starts this
node's torchrun agent through `musubi train`'s own launcher (c10d rendezvous on the
allocation's first node when the job spans several), resuming from the newest
committed checkpoint when there is one (a requeued job), and on the first node
runs the job's evaluation step (fleet/eval_step.py, as the local executor does).
The first node leaves `logs/slurm-ID.exit` with the exit code last, for a fleet
that reattaches after Slurm has forgotten the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from musubi.contract.env import MUSUBI_DEVICE
from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG, EXIT_TERMINATED
from musubi.contract.run_files import RUN_FILES
from musubi.store.rundir import read_json

#: Rendezvous ports of multi-node jobs: one per Slurm job id, so jobs sharing a first node do not collide.
PORT_BASE, PORT_SPAN = 20000, 20000


def first_node() -> str:
    """The address of the allocation's first node (node rank 0 hosts the rendezvous): its NodeAddr, else name."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    name = out.stdout.split()[0]
    node = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True).stdout
    fields = dict(f.split("=", 1) for f in node.split() if "=" in f)
    return fields.get("NodeAddr") or name


def _cpu_env(info: dict) -> None:
    """CPU ranks: no GPU, the task's cores shared by its ranks (GPU jobs: Slurm sets CUDA_VISIBLE_DEVICES)."""
    os.environ[MUSUBI_DEVICE] = info["device"]
    if info["device"] == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0)
    if cpus and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, cpus // max(1, int(info["gpus"]))))


def _train(run_dir: Path, name: str, info: dict, node_rank: int, nnodes: int, jid: str) -> int:
    from musubi.checkpoint.checkpoint import latest_checkpoint
    from musubi.launch.launch import launch_train
    from musubi.launch.request import TrainRequest

    job_dir = run_dir / name
    resume = latest_checkpoint(job_dir / RUN_FILES.checkpoints) is not None
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if node_rank == 0 and not resume and job_dir.exists():
        # An earlier run of this job left files but no checkpoint: keep them, start clean beside them.
        # logs/ stays: Slurm appends this job's output to logs/slurm-ID.log.
        left = [p for p in job_dir.iterdir() if p.name != RUN_FILES.logs]
        if left:
            aside = run_dir / f"{name}.slurm{jid}.restart{restart}"
            aside.mkdir(parents=True, exist_ok=True)
            for p in left:
                p.rename(aside / p.name)
    multi = nnodes > 1
    req = TrainRequest(job_path=Path(info["spec"]), nproc=int(info["gpus"]), out=run_dir, resume=resume,
                       device=info["device"], check=False, fleet_member=True, argv=sys.argv, nnodes=nnodes,
                       node_rank=node_rank,
                       rdzv_endpoint=f"{first_node()}:{PORT_BASE + int(jid) % PORT_SPAN}" if multi else None,
                       rdzv_id=f"{name}-slurm{jid}-{restart}")
    print(f"musubi: slurm job {jid} node {node_rank}/{nnodes}: {name} "
          f"{'resuming from its newest checkpoint' if resume else 'from the start'}", flush=True)
    try:
        result = launch_train(req)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except KeyboardInterrupt:  # Slurm's SIGTERM (preemption, scancel): the ranks were stopped and recorded
        print("error: interrupted: the ranks were stopped", file=sys.stderr, flush=True)
        return EXIT_TERMINATED
    if result.code:
        print(f"error: {result.error}", file=sys.stderr, flush=True)
    return result.code


def _command(run_dir: Path, info: dict) -> int:
    from musubi.config.fleet import CommandJob
    from musubi.fleet.jobs import command_launch

    job = CommandJob(**info["job"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    gpus = [int(g) for g in visible.split(",") if g.strip().isdigit()] if info["device"] == "cuda" else []
    launch = command_launch(job, run_dir, gpus, info["device"], Path(info["base"]))
    launch.log.parent.mkdir(parents=True, exist_ok=True)
    with open(launch.log, "a", encoding="utf-8") as f:
        return subprocess.call(launch.argv, env=launch.env, cwd=launch.cwd, stdout=f, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    """Run this node's part of one fleet job; the exit code is the job's (0: trained and evaluated)."""
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        print("usage: python -m musubi.fleet.slurm_node RUN_DIR JOB", file=sys.stderr)
        return EXIT_CONFIG
    run_dir, name = Path(args[0]), args[1]
    info = read_json(run_dir / ".slurm" / f"{name}.json")
    node_rank = int(os.environ.get("SLURM_NODEID", "0"))
    nnodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    jid = os.environ.get("SLURM_JOB_ID", "0")
    marker = run_dir / name / RUN_FILES.logs / f"slurm-{jid}.exit"
    if node_rank == 0:
        marker.unlink(missing_ok=True)  # a requeued job: the verdict of this run only
    _cpu_env(info)
    code = _train(run_dir, name, info, node_rank, nnodes, jid) if info["kind"] == "task" else _command(run_dir, info)
    if node_rank != 0:
        return code
    if code == 0:
        # The evaluation step of the local executor, on this job's own allocation.
        external = [] if info["kind"] == "task" else ["--external"]  # its step imports no torch
        code = subprocess.call([sys.executable, "-m", "musubi.fleet.eval_step", *external, str(run_dir / name)],
                               stdin=subprocess.DEVNULL)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{code}\n", encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main())
