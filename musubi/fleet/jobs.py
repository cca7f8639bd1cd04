"""How one fleet job becomes a process: argv, environment, working directory, and failure cause."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from musubi.config.fleet import CommandJob, TaskJob
from musubi.contract.env import MUSUBI_CPUS, MUSUBI_DEVICE, MUSUBI_JOB_DIR
from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG
from musubi.contract.run_files import RUN_FILES
from musubi.recovery.numerics import trained_precision
from musubi.topology.model import parse_cpulist

#: Variables an external job inherits from Musubi's own environment (the rest is explicit):
#: the basics of a process, and the GPU/NCCL safety settings of the machine.
INHERITED = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "TERM")
INHERITED_PREFIXES = ("NCCL_", "CUDA_DEVICE_ORDER", "TORCH_SYMM_MEM", "NVSHMEM_")


@dataclass
class Launch:
    """A process to start for a job."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    cpus: tuple[int, ...] = ()  # cores the started process is pinned to (external commands); () = not pinned


def union_cpus(cpus: str | None) -> tuple[int, ...]:
    """Every core of a MUSUBI_CPUS value ('0-3;4-7' -> 0..7); () for None."""
    return tuple(sorted({c for part in (cpus or "").split(";") for c in parse_cpulist(part)}))


def pin_process(pid: int, cpus: tuple[int, ...]) -> None:
    """Pin a just-started process to `cpus` (what it starts later inherits them); nothing for () or off Linux.

    Done right after Popen rather than in a `preexec_fn`, which is unsafe while the fleet's threads run.
    """
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    try:
        os.sched_setaffinity(pid, cpus)
    except OSError:  # already gone, or cores outside this process's cgroup: it runs unpinned
        pass


def gpu_env(gpus: list[int], kind: str, threads: int | None = None, cpus: str | None = None) -> dict[str, str]:
    """The devices a job may see (its GPUs only; none for CPU ranks), its CPU threads per rank and cores."""
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus) if kind == "cuda" else ""}
    if cpus:
        # One core set per local rank, in the order of the job's GPUs (see worker/pinning.py).
        env[MUSUBI_CPUS] = cpus
        threads = min(len(parse_cpulist(part)) for part in cpus.split(";"))
    if threads is not None and "OMP_NUM_THREADS" not in os.environ:
        # Jobs run side by side: each rank gets its share of the cores, not all of them.
        env["OMP_NUM_THREADS"] = str(threads)
    return env


#: Compiled-kernel caches every job of the fleet (and the next fleet beside it) shares: folders under
#: RUNS/.cache/ beside musubi.db. A user's own setting of the variable wins. Only what torch writes to disk
#: can be shared: Inductor's and Triton's compiled kernels (torch.compile). cudnn's autotune choices
#: (torch.backends.cudnn.benchmark), NCCL communicators, the CUDA context and the caching allocator live in
#: one process and are rebuilt by each job; the CUDA driver's own PTX cache (~/.nv/ComputeCache) persists already.
SHARED_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def cache_env(run_dir: Path) -> dict[str, str]:
    """The shared compiled-kernel cache folders (SHARED_CACHES) for a job of the fleet in `run_dir`."""
    root = run_dir.resolve().parent / ".cache"
    return {var: str(root / sub) for var, sub in SHARED_CACHES.items() if var not in os.environ}


def write_job_spec(job: TaskJob, run_dir: Path, pin: bool = True) -> Path:
    """RUN/.fleet/JOB.yaml: the resolved job `musubi train` of a fleet member reads."""
    spec_path = run_dir / ".fleet" / f"{job.name}.yaml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    resolved = job.spec.resolved()
    if not pin:
        resolved["train"]["pin_cpus"] = False
    spec_path.write_text(yaml.safe_dump(resolved, sort_keys=False), encoding="utf-8")
    return spec_path


def task_launch(job: TaskJob, run_dir: Path, gpus: list[int], kind: str, resume: bool,
                threads: int | None = None, cpus: str | None = None, pin: bool = True) -> Launch:
    """`musubi train` of a task job as a fleet member (its own torchrun, its own rendezvous port).

    `cpus`: MUSUBI_CPUS for its ranks (the cores of its GPUs); `pin` False: the fleet turned pinning off.
    """
    spec_path = write_job_spec(job, run_dir, pin)
    # --nproc: the GPUs the packer gave it (a moldable job's width may differ from its `gpus:`).
    argv = [sys.executable, "-m", "musubi.cli", "train", str(spec_path), "--out", str(run_dir), "--nproc",
            str(len(gpus) or job.gpus), "--device", kind, "--no-check", "--fleet-member"]
    if resume:
        argv.append("--resume")
    env = dict(os.environ, **gpu_env(gpus, kind, threads, cpus), **cache_env(run_dir), PYTHONUNBUFFERED="1")
    if not cpus:  # a MUSUBI_CPUS of the fleet's own environment would give every job the same cores
        env.pop(MUSUBI_CPUS, None)
    env[MUSUBI_DEVICE] = kind
    log = run_dir / job.name / RUN_FILES.logs / RUN_FILES.fleet_log
    return Launch(argv, env, Path.cwd(), log)


def resolve_command(job: CommandJob, base: Path) -> list[str]:
    """The argv of an external job with its interpreter; relative script paths resolved from the fleet file."""
    argv = list(job.command)
    # A Python script without an interpreter named runs with Musubi's own Python.
    if job.python or job.launch == "torchrun" or argv[0].endswith(".py"):
        script = Path(argv[0])
        if not script.is_absolute() and (base / script).exists():
            argv[0] = str((base / script).resolve())
        python = job.python or sys.executable
        if job.launch == "torchrun":
            return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={job.gpus}", *argv]
        return [python, *argv]
    exe = Path(argv[0])
    if not exe.is_absolute() and (base / exe).exists():
        argv[0] = str((base / exe).resolve())
    return argv


def framework_python(job: CommandJob, base: Path) -> str | None:
    """The interpreter that has an external job's framework (metrics_from's export runs in it): metrics_from.python,
    the job's `python:`, Musubi's own for a .py command or torchrun, else the one the program's #! line names
    (an installed `yolo` script); None when none can be told (a binary, a shell script)."""
    chosen = job.metrics_from.python if job.metrics_from is not None else None
    if chosen or job.python:
        return chosen or job.python
    argv = resolve_command(job, base)
    if job.launch == "torchrun" or job.command[0].endswith(".py"):
        return argv[0]
    program = Path(argv[0]) if Path(argv[0]).is_file() else Path(shutil.which(argv[0]) or argv[0])
    try:
        with open(program, "rb") as f:
            first = f.readline(512).decode("utf-8", errors="replace")
    except OSError:
        return None
    words = first[2:].split() if first.startswith("#!") else []
    if words and Path(words[0]).name == "env" and len(words) > 1:  # #!/usr/bin/env python3
        words = [shutil.which(words[1]) or words[1]]
    return words[0] if words and "python" in Path(words[0]).name else None


def check_command(job: CommandJob, base: Path) -> None:
    """Refuse, before anything starts, a command whose program or interpreter does not exist."""
    argv = resolve_command(job, base)
    if job.python and not (Path(job.python).exists() or shutil.which(job.python)):
        raise ConfigError(f"job {job.name!r}: python {job.python!r} not found; give the interpreter's path")
    prog = argv[0]
    if not (Path(prog).exists() or shutil.which(prog)):
        raise ConfigError(f"job {job.name!r}: command {prog!r} not found; give a path or a program on PATH")
    if job.python or job.launch == "torchrun" or job.command[0].endswith(".py"):
        script = argv[4] if job.launch == "torchrun" else argv[1]
        if script.endswith(".py") and not Path(script).exists():
            raise ConfigError(f"job {job.name!r}: script {script!r} not found (paths are relative to the fleet file)")


def command_launch(job: CommandJob, run_dir: Path, gpus: list[int], kind: str, base: Path,
                   threads: int | None = None, cpus: str | None = None) -> Launch:
    """An external job: explicit environment, the job's folder as working directory, pinned to its GPUs' cores."""
    job_dir = run_dir / job.name
    job_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)}
    if job.python is None and "PYTHONPATH" in os.environ:
        # Run with Musubi's own interpreter: it sees the packages Musubi sees (found missing on the
        # GPU machine, where musubi itself comes from PYTHONPATH). Another venv (`python:`) gets none.
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.update(job.env)
    for k, v in gpu_env(gpus, kind, threads, cpus).items():
        if k == "CUDA_VISIBLE_DEVICES" or k not in job.env:  # the job's GPUs are not the job's to choose
            env[k] = v
    env[MUSUBI_JOB_DIR] = str(job_dir.resolve())
    env["PYTHONUNBUFFERED"] = "1"
    adapter = job_dir / RUN_FILES.metrics_from
    if job.metrics_from is not None:
        # The evaluation step reads it (fleet/eval_step.py), as does `musubi evaluate` run by hand later.
        # With the interpreter that has the framework, for the export of its weights (evaluate/framework_export.py).
        adapter.write_text(json.dumps({**job.metrics_from.model_dump(), "python": framework_python(job, base)}),
                           encoding="utf-8")
    else:
        adapter.unlink(missing_ok=True)
    return Launch(resolve_command(job, base), env, job_dir, job_dir / RUN_FILES.logs / RUN_FILES.stdout_log, union_cpus(cpus))


def failure_cause(job_dir: Path, code: int) -> str:
    """Why a job failed, in a word and a detail: oom, config, defect, nccl, signal N, exit N."""
    record = {}
    try:
        record = json.loads((job_dir / RUN_FILES.job).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    err = ""
    if record.get("history"):
        err = str(record["history"][-1].get("error") or "")
    if code < 0:
        return f"signal {-code}"
    defect = record["history"][-1].get("defect") if record.get("history") else None
    if code != EXIT_CONFIG and defect:  # the same cause after a restart: not retried (recovery/repeats.py)
        return f"defect: {str(defect)[:400]}"
    failures = record["history"][-1].get("failures") if record.get("history") else None
    if code != EXIT_CONFIG and failures:
        # The failure that ended the launch, as goodput named it (the rank killed or hung).
        from musubi.recovery.goodput import failure_summary

        last = failures[-1]
        return f"{'oom' if last.get('cause') == 'oom' else f'exit {code}'}: {failure_summary(last)[:200]}"
    if "out of memory" in err.lower():
        return f"oom: {err[:200]}"
    if code == EXIT_CONFIG:
        return f"config: {err[:200]}" if err else "config"
    if "nccl" in err.lower():
        return f"nccl: {err[:200]}"
    return f"exit {code}: {err[:200]}" if err else f"exit {code}"


def absorb_job_record(st: Any, job_dir: Path, failed: bool) -> str:
    """Copy the latest launch's restarts, failures and goodput (JOB/job.json history) into the fleet's JobState.

    Failures torchrun recovered from inside the job become causes too ("recovered: ..."); the one that
    ended a failed launch is left to `failure_cause`. Failures that repeated (a defect: recovery/repeats.py)
    are never "recovered": a launch that finished anyway gets a "defect: ..." cause. Returns a suffix for
    the done/failed line ("" if none).
    """
    try:
        history = json.loads((job_dir / RUN_FILES.job).read_text(encoding="utf-8")).get("history") or []
    except (OSError, ValueError):
        return ""
    precision = trained_precision(job_dir)
    if precision is not None:
        st.precision = precision["final"]
    entry = history[-1] if history and isinstance(history[-1], dict) else None
    # Only this launch's entry (a launch that died before `musubi train` recorded it leaves an older one).
    if entry is None or (st.started is not None and float(entry.get("started", 0)) < st.started - 5):
        return ""
    from musubi.recovery.goodput import failure_summary

    failures = [f for f in entry.get("failures") or [] if isinstance(f, dict)]
    repeated = {f.get("repeat_of") for f in failures} | {f.get("attempt") for f in failures if f.get("repeat_of")}
    recovered = [f for f in (failures[:-1] if failed and failures else failures) if f.get("attempt") not in repeated]
    st.restarts += int(entry.get("restarts") or 0)
    st.failures += [dict(f, recovered=f in recovered) for f in failures]
    st.goodput = entry.get("goodput")
    for f in recovered:
        st.causes.append(f"recovered (attempt {f.get('attempt')}): {failure_summary(f)[:200]}")
    if entry.get("defect") and not failed:  # it finished, yet the same cause struck twice
        st.causes.append(f"defect: {str(entry['defect'])[:400]}")
        return f"; but {entry['defect']}"
    if not recovered:
        return ""
    what = ", ".join(failure_summary({k: v for k, v in f.items() if k != "detail"}) for f in recovered)
    g = st.goodput
    return f"; {len(recovered)} failure(s) recovered by restart: {what}" + (f"; goodput {g:.1%}" if g else "")


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of the newest attempt in a log file (for a failed job's report; an earlier attempt's lines
    never show), after a line naming the log."""
    if not path.is_file():
        return f"(no log at {path})"
    tail = attempt_log(path).splitlines()[-lines:]
    return "\n".join([f"--- last {len(tail)} lines of {path} ---", *tail])


def eval_error(path: Path) -> str | None:
    """The reason the evaluation step gave for failing (its last `error: ...` line in the newest attempt's part of
    the job's log), or None."""
    said = [ln[len("error: "):].strip() for ln in attempt_log(path).splitlines() if ln.startswith("error: ")]
    return said[-1][:400] if said else None


#: What the evaluation step prints when an external job broke its contract (fleet/eval_step.py).
NO_EVAL_JSON = f"wrote no {RUN_FILES.eval} to ${MUSUBI_JOB_DIR}"

_OOM = ("cuda out of memory", "outofmemoryerror", "cuda error: out of memory", "cublas_status_alloc_failed",
        "hip out of memory")
_NCCL = ("nccl error", "ncclinternalerror", "ncclsystemerror", "ncclunhandledcudaerror", "ncclinvalidusage",
         "ncclremoteerror", "distbackenderror", "processgroupnccl", "nccl watchdog", "nccl timeout")


def attempt_log(path: Path, max_bytes: int = 256 * 1024) -> str:
    """The newest attempt's part of a job log (after the fleet's last `=== musubi run:` line), at most its end."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    cut = text.rfind("=== musubi run:")
    return text[cut:] if cut >= 0 else text


def log_cause(path: Path, code: int) -> str | None:
    """oom / nccl with the log line that shows it (an external job's own output), or None."""
    if code < 0:
        return None
    lines = attempt_log(path).splitlines()
    for kind, needles in (("oom", _OOM), ("nccl", _NCCL)):
        for ln in reversed(lines):
            if any(n in ln.lower() for n in needles):
                return f"{kind}: {ln.strip()[:200]}"
    return None
