"""The Slurm executor: each job of a fleet becomes a Slurm job, from an sbatch script Musubi writes.

A job asks Slurm for its nodes, one task per node with the CPUs of its ranks,
its GPUs per node (`--gres=gpu:N`), memory and time; `srun` starts
`musubi.fleet.slurm_node` once per node, which starts one torchrun agent there
(c10d rendezvous on the allocation's first node for multi-node jobs) and, on the
first node, the job's evaluation step after training. Fleet priorities become
`--nice` (higher priority, lower nice), `after:` becomes `--dependency=afterok`.
Every job is `--requeue`-able: a requeued or preempted job starts again and
resumes from its newest committed checkpoint (exact resume). `RUN/fleet.json`
records each job's Slurm id, state and log; `musubi run --resume` reattaches to
the jobs in flight (squeue, then sacct or scontrol) instead of submitting again.
Musubi runs on the login node and polls; it schedules nothing itself.
"""

from __future__ import annotations

import logging
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from musubi.config.fleet import CommandJob, FleetSpec, TaskJob
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.fleet import jobs
from musubi.fleet.local import JobState, fleet_states
from musubi.store.rundir import write_json

log = logging.getLogger("musubi.fleet")

#: Slurm states of a job still in the queue or running (it may run again after a requeue).
IN_FLIGHT = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
             "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "PREEMPTED", "RESV_DEL_HOLD", "STOPPED"}


def _slurm(argv: list[str], check: bool = True) -> str:
    """Run a Slurm client command; its stdout (ConfigError with Slurm's own line when it fails and `check`)."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ConfigError(f"--executor slurm: {argv[0]} not found on PATH; run musubi on a Slurm login node "
                          "(with slurm-client installed)") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"--executor slurm: `{' '.join(argv[:2])}` did not answer within 60 s; is slurmctld "
                          "up? (scontrol ping)") from None
    if check and res.returncode != 0:
        why = (res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}").splitlines()[-1]
        raise ConfigError(f"--executor slurm: `{' '.join(argv[:2])}` failed: {why}")
    return res.stdout


def check_slurm() -> None:
    """Refuse, before anything is written, where Slurm's commands or controller are missing."""
    for cmd in ("sbatch", "squeue", "scontrol", "srun"):
        if shutil.which(cmd) is None:
            raise ConfigError(f"--executor slurm: {cmd} not found on PATH; run musubi on a Slurm login node "
                              "(with slurm-client installed)")
    out = _slurm(["scontrol", "ping"], check=False)
    if "UP" not in out:
        raise ConfigError(f"--executor slurm: the Slurm controller does not answer ({out.strip() or 'no reply'}); "
                          "check slurmctld")


def cluster_kind() -> str:
    """cuda when some node of the cluster offers GPUs (a gres gpu), else cpu."""
    gres = _slurm(["sinfo", "-h", "-o", "%G"], check=False)
    return "cuda" if "gpu" in gres else "cpu"


def nice_values(spec: FleetSpec) -> dict[str, int]:
    """Fleet priority (higher runs earlier) as Slurm's nice (lower runs earlier; users may not go below 0)."""
    top = max(j.priority for j in spec.jobs)
    return {j.name: top - j.priority for j in spec.jobs}


def sbatch_options(job: TaskJob | CommandJob, spec: FleetSpec, kind: str, nice: int, log_pattern: Path) -> list[str]:
    """The #SBATCH lines of one job: nodes, a task per node with its ranks' CPUs, GPUs, memory, time, policy."""
    cfg = spec.slurm
    cpus = job.gpus * (job.cpus_per_rank or cfg.cpus_per_rank)
    opts = [f"--job-name=musubi.{spec.name}.{job.name}", f"--nodes={job.nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={cpus}"]
    if kind == "cuda":
        opts.append(f"--gres=gpu:{job.gpus}")
    if job.host_memory_gib:
        opts.append(f"--mem={int(job.host_memory_gib * 1024)}M")
    minutes = job.time_min or cfg.time_min
    if minutes:
        opts.append(f"--time={minutes}")
    opts += [f"--nice={nice}", "--requeue", "--open-mode=append", f"--output={log_pattern}",
             f"--chdir={Path.cwd()}"]
    for flag, value in (("partition", cfg.partition), ("account", cfg.account), ("qos", cfg.qos)):
        if value:
            opts.append(f"--{flag}={value}")
    if job.nodes > 1 and cfg.contiguous:
        opts.append("--contiguous")
    if job.nodes > 1 and cfg.switches:
        opts.append(f"--switches={cfg.switches}")
    return opts + list(cfg.extra)


def batch_script(options: list[str], run_dir: Path, job_name: str) -> str:
    """The sbatch script: one `musubi.fleet.slurm_node` per node under srun (the environment is the submitter's)."""
    lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in options),
             f"# Written by musubi run --executor slurm for job {job_name} of {run_dir}.",
             "# A requeued job runs this again and resumes from its newest committed checkpoint.",
             "set -u",
             "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 "
             + " ".join(shlex.quote(a) for a in [sys.executable, "-m", "musubi.fleet.slurm_node",
                                                 str(run_dir.resolve()), job_name])]
    return "\n".join(lines) + "\n"


def queue_states(ids: list[str]) -> dict[str, str]:
    """State of each job squeue still knows (pending, running, requeued...)."""
    if not ids:
        return {}
    out = _slurm(["squeue", "-h", "-o", "%i|%T", "-j", ",".join(ids)], check=False)
    states = {}
    for ln in out.splitlines():
        jid, _, state = ln.strip().partition("|")
        if jid in ids:
            states[jid] = state
    return states


def ended_state(jid: str) -> tuple[str, int]:
    """(state, exit code) of a job squeue forgot: sacct where accounting is on, else scontrol (MinJobAge)."""
    out = _slurm(["sacct", "-n", "-X", "-P", "-o", "JobID,State,ExitCode", "-j", jid], check=False) \
        if shutil.which("sacct") else ""
    for ln in out.splitlines():
        parts = ln.split("|")
        if len(parts) == 3 and parts[0] == jid:
            return parts[1].split()[0], int(parts[2].split(":")[0] or 0)
    out = _slurm(["scontrol", "show", "job", "-o", jid], check=False)
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    if fields.get("JobId") == jid:
        return fields.get("JobState", "UNKNOWN"), int(fields.get("ExitCode", "0:0").split(":")[0] or 0)
    return "UNKNOWN", -1


def _order(spec: FleetSpec) -> list[TaskJob | CommandJob]:
    """Jobs with their dependencies first (the fleet refused cycles), then by priority."""
    left = sorted(spec.jobs, key=lambda j: -j.priority)
    placed: list[TaskJob | CommandJob] = []
    while left:
        names = {j.name for j in placed}
        job = next(j for j in left if set(j.after) <= names)
        placed.append(job)
        left.remove(job)
    return placed


class SlurmFleet:
    """Submits a validated fleet to Slurm and follows it to the end (or reattaches to it)."""

    def __init__(self, spec: FleetSpec, run_dir: Path, base: Path, kind: str, resume: bool,
                 console: Console | None = None) -> None:
        self.spec, self.run_dir, self.base, self.kind = spec, run_dir, base, kind
        self.console = console or Console()
        self.jobs = {j.name: j for j in spec.jobs}
        self.state_path = run_dir / RUN_FILES.fleet
        self.nice = nice_values(spec)
        self.states = fleet_states(spec, self.state_path if resume else None)
        for st in self.states.values():
            if st.state == "failed":  # a new chance, like the local executor's --resume; running ones reattach
                st.state, st.scheduler_id = "queued", ""

    def save_state(self) -> None:
        """Write fleet.json (atomically), with the executor so --resume reattaches the same way."""
        write_json(self.state_path, {"fleet": self.spec.name, "executor": "slurm",
                                     "jobs": {n: vars(s) for n, s in self.states.items()}})

    # -- submitting -------------------------------------------------------------
    def _write_job(self, job: TaskJob | CommandJob) -> Path:
        """RUN/.slurm/JOB.json (what slurm_node runs) and RUN/.slurm/JOB.sbatch; the script's path."""
        folder = self.run_dir / ".slurm"
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(job, TaskJob):
            what = {"kind": "task", "spec": str(jobs.write_job_spec(job, self.run_dir, self.spec.machine.pin_cpus)
                                                .resolve())}
        else:
            what = {"kind": "command", "job": job.model_dump(mode="json"), "base": str(self.base)}
        what.update(gpus=job.gpus, nodes=job.nodes, device=self.kind)
        write_json(folder / f"{job.name}.json", what)
        logs = self.run_dir / job.name / RUN_FILES.logs
        logs.mkdir(parents=True, exist_ok=True)
        opts = sbatch_options(job, self.spec, self.kind, self.nice[job.name], logs.resolve() / "slurm-%j.log")
        script = folder / f"{job.name}.sbatch"
        script.write_text(batch_script(opts, self.run_dir, job.name), encoding="utf-8")
        return script

    def _submit(self, name: str, count_attempt: bool = True) -> None:
        job, st = self.jobs[name], self.states[name]
        script = self._write_job(job)
        argv = ["sbatch", "--parsable"]
        deps = [self.states[d].scheduler_id for d in job.after if self.states[d].state != "done"]
        if deps:
            argv.append("--dependency=afterok:" + ":".join(deps))
        jid = _slurm([*argv, str(script)]).strip().split(";")[0]
        if count_attempt:
            st.attempts += 1
        st.state, st.scheduler_id, st.scheduler_state = "running", jid, "PENDING"
        st.started, st.ended = time.time(), None
        st.log = str(self.run_dir / name / RUN_FILES.logs / f"slurm-{jid}.log")
        st.placement = f"slurm job {jid}: " + " ".join(o for o in self._opts(job) if not o.startswith("--output"))
        self._say(f"submitted {name} as slurm job {jid}" + (f" (after {', '.join(job.after)})" if deps else ""))
        self.save_state()

    def _opts(self, job: TaskJob | CommandJob) -> list[str]:
        return sbatch_options(job, self.spec, self.kind, self.nice[job.name], Path("-"))[1:6]

    def _dependents(self, name: str) -> list[str]:
        """Jobs that wait on `name`, directly or not, in submission order."""
        out: list[str] = []
        for job in _order(self.spec):
            if job.name != name and (name in job.after or set(job.after) & set(out)):
                out.append(job.name)
        return out

    # -- following ----------------------------------------------------------------
    def run(self) -> dict[str, JobState]:
        """Submit what is not in Slurm yet, then poll until every job ended well or failed for good."""
        for job in _order(self.spec):
            if self.states[job.name].state == "queued":
                self._submit(job.name)
            elif self.states[job.name].state == "running":
                self._say(f"reattached to {job.name} (slurm job {self.states[job.name].scheduler_id})")
        self.save_state()
        try:
            while any(s.state == "running" for s in self.states.values()):
                time.sleep(self.spec.slurm.poll_s)
                self._poll()
        except KeyboardInterrupt:
            self.save_state()
            self.console.print(f"detached: the jobs keep running in Slurm; `musubi run FLEET --out {self.run_dir} "
                               "--resume` reattaches", highlight=False, markup=False)
            raise
        self.save_state()
        return self.states

    def _poll(self) -> None:
        flying = {s.scheduler_id: s for s in self.states.values() if s.state == "running"}
        queued = queue_states(list(flying))
        changed = False
        for jid, st in flying.items():
            state, code = queued.get(jid), 0
            if state is None or state not in IN_FLIGHT:  # gone from the queue, or shown there as ended
                state, code = ended_state(jid)
                if state == "UNKNOWN":  # Slurm forgot it (no accounting, past MinJobAge): the job's own marker
                    marker = self.run_dir / st.name / RUN_FILES.logs / f"slurm-{jid}.exit"
                    if marker.is_file():
                        code = int(marker.read_text(encoding="utf-8").strip() or 1)
                        state = "COMPLETED" if code == 0 else "FAILED"
            if state != st.scheduler_state:
                st.scheduler_state, changed = state, True
                log.info("slurm job %s (%s): %s", jid, st.name, state)
            if state in IN_FLIGHT or state == "UNKNOWN":
                continue
            self._ended(st, state, code)
            changed = True
        if changed:
            self.save_state()

    def _ended(self, st: JobState, state: str, code: int) -> None:
        st.ended = time.time()
        job_dir = self.run_dir / st.name
        # TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, CANCELLED end the job too: its last failure was not recovered from
        recovered = jobs.absorb_job_record(st, job_dir, failed=state != "COMPLETED")
        if state == "COMPLETED":
            st.state = "done"
            self._say(f"done {st.name} (slurm job {st.scheduler_id}, {st.ended - (st.started or st.ended):.0f}s)"
                      f"{recovered}")
            return
        cause = jobs.failure_cause(job_dir, code) if state == "FAILED" else f"slurm {state} (exit {code})"
        st.causes.append(f"slurm job {st.scheduler_id}: {cause}")
        retry = st.attempts <= self.jobs[st.name].retries and not cause.startswith(("config", "defect"))
        self._say(f"failed {st.name} (slurm job {st.scheduler_id}, {state}): {cause}" + ("; retrying" if retry
                                                                                      else ""))
        later = self._dependents(st.name)
        if retry:
            self._submit(st.name)
            # Its dependents wait on the old id, which never ends well: point them at the new submission.
            for dep in later:
                if self.states[dep].state == "running":
                    _slurm(["scancel", self.states[dep].scheduler_id], check=False)
                    self._submit(dep, count_attempt=False)
            return
        st.state = "failed"
        for dep in later:
            dst = self.states[dep]
            if dst.state == "running":
                _slurm(["scancel", dst.scheduler_id], check=False)
            if dst.state != "done":
                dst.state, dst.ended = "failed", time.time()
                dst.causes.append(f"dependency {st.name!r} failed")
                self._say(f"failed {dep}: it waits for {st.name}, which failed")

    def _say(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)
        log.info("%s", text)

