"""One soaked job (bench/soak.py): its `musubi train` launches, the faults it is struck with, its commits."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import soak_records as rec

REPO = Path(__file__).resolve().parents[1]
#: Seconds a fault may take to strike (an armed checkpoint fault waits for the next save) or to be recovered
#: from before the soak stops and reports it as not recovered.
STRIKE_TIMEOUT_S = 60.0
RECOVER_TIMEOUT_S = 180.0
JOB_NAME = "soak"


class Console:
    """A soak's console (one job's or the fleet's): each line timestamped, named, printed and appended to its log."""

    def __init__(self, path: Path, name: str = "") -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the soak's whole life
        self.prefix = f"{name}: " if name else ""

    def say(self, msg: str) -> None:
        """`[HH:MM:SS] name: msg` on stdout and in the log, flushed (a killed soak keeps what it said)."""
        line = f"[{time.strftime('%H:%M:%S')}] {self.prefix}{msg}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


class Soak:
    """Drives one job: launches, injects, relaunches after a preemption, watches commits, stops it."""

    def __init__(self, args: argparse.Namespace, job_file: Path, out: Path, name: str = "") -> None:
        self.args, self.job_file, self.out, self.name = args, job_file, out, name
        self.run_dir = out / "run"
        self.job_dir = self.run_dir / JOB_NAME
        self.proc: subprocess.Popen | None = None
        self.commits: dict[int, float] = {}  # step -> commit time (marker), every checkpoint ever committed
        self.launch_exits: list[float] = []
        self.console = Console(out / "soak.log", name)

    # -- the job's processes ----------------------------------------------------------------------
    def launch(self, resume: bool) -> None:
        """`musubi train` in a session of its own (a preemption signals the whole group)."""
        env = dict(os.environ, MUSUBI_INJECT="armed", LOGLEVEL="INFO",  # torchrun's restart lines, timestamped
                   PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        cmd = [sys.executable, "-m", "musubi.cli", "train", str(self.job_file), "--nproc", str(self.args.nprocs),
               "--device", self.args.device, "--out", str(self.run_dir), "--no-check", *(["--resume"] if resume else [])]
        with open(self.out / "train.log", "a", encoding="utf-8") as f:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def stop(self, grace_s: float = 60.0) -> float:
        """SIGTERM the job's process group (a preemption); SIGKILL what is left after `grace_s`; the exit time."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        t = time.time()
        self.launch_exits.append(t)
        return t

    def attempts(self) -> list[rec.Attempt]:
        return rec.read_attempts(self.job_dir)

    def training(self, after: str | None) -> rec.Attempt | None:
        """The newest attempt if it is not `after` and has finished a step since it started training (a fault may
        strike before the first checkpoint: a preempted run without one resumes from step 0 in its folder)."""
        atts = self.attempts()
        a = atts[-1] if atts else None
        if a is None or a.id == after or not a.steps or a.train_start is None:
            return None
        return a if a.steps[-1][0] >= a.train_start else None

    def pid_of(self, attempt: str, rank: int) -> int | None:
        hb = rec._json(self.job_dir / "heartbeat" / f"a{attempt}-rank{rank}.json")  # noqa: SLF001
        return int(hb["pid"]) if isinstance(hb, dict) and "pid" in hb else None

    def poll_commits(self) -> None:
        """Note every checkpoint the moment its marker appears (retention deletes old ones later)."""
        root = self.job_dir / "checkpoints"
        for d in root.glob("step-*") if root.is_dir() else []:
            step = int(d.name.split("-")[1])
            if step not in self.commits:
                marker = rec._json(d / "COMMITTED")  # noqa: SLF001
                if isinstance(marker, dict) and "time" in marker:
                    self.commits[step] = float(marker["time"])

    def wait_for(self, until: float, cond: Any) -> Any:
        """Poll (commits too) until `cond()` is truthy or the wall clock passes `until`; its value or None."""
        while time.time() < until:
            self.poll_commits()
            got = cond()
            if got:
                return got
            if self.proc is not None and self.proc.poll() is not None:
                return None  # the job ended on its own: a failure, the caller reports it
            time.sleep(0.1)
        return None

    # -- faults -----------------------------------------------------------------------------------
    def arm(self, n: int, spec: str) -> Path:
        """Drop a fault for the ranks to pick up (written whole, then renamed into place)."""
        d = self.job_dir / "logs" / "inject"
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".armed-{n}.tmp"
        tmp.write_text(spec + "\n", encoding="utf-8")
        tmp.replace(d / f"armed-{n}.txt")
        return d

    def strike(self, f: dict[str, Any], a: rec.Attempt) -> float | None:
        """Inject fault `f` into attempt `a`; when it struck (None: it never did)."""
        kind, rank = f["kind"], f["rank"]
        if kind in ("kill", "hang"):
            pid = self.pid_of(a.id, rank)
            if pid is None:
                return None
            t = time.time()
            os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            return t
        if kind == "preempt":
            t = time.time()
            self.stop()
            self.launch(resume=True)
            return t
        spec = {"nan": f"nan:rank={rank}", "oom": f"oom:rank={rank},phase={f['phase']}",
                "disk_full": "disk_full", "torn": f"ckpt_kill:rank={rank},phase=write"}[kind]
        d = self.arm(f["n"], spec)
        # The fault's index in the injector: file N's first (only) fault (contract/inject.py ARMED_INDEX).
        from musubi.contract.inject import ARMED_INDEX

        marks = f"fired-{ARMED_INDEX + f['n'] * 100}-rank*"

        def fired() -> float | None:
            times = []
            for p in d.glob(marks):
                text = p.read_text(encoding="utf-8")
                times.append(float(text.rsplit("time=", 1)[1]) if "time=" in text else p.stat().st_mtime)
            return min(times) if times else None

        return self.wait_for(time.time() + STRIKE_TIMEOUT_S, fired)

    # -- the soak ---------------------------------------------------------------------------------
    def run(self, faults: list[dict[str, Any]]) -> dict[str, Any]:
        wall_s = self.args.minutes * 60
        t0 = time.time()
        self.launch(resume=False)
        self.console.say(f"launched {JOB_NAME} on {self.args.nprocs} {self.args.device} rank(s); {len(faults)} fault(s) "
                 f"scheduled over {wall_s:.0f} s")
        done: list[dict[str, Any]] = []
        prev: str | None = None
        end = t0 + wall_s
        for f in faults:
            # The job trains again (a new attempt after a restarting fault); then `gap_s` seconds of training.
            a = self.wait_for(end, lambda p=prev: self.training(p))
            if a is None:
                break
            self.wait_for(min(end, time.time() + f["gap_s"]), lambda: False)
            a = self.training(prev)
            if a is None or time.time() >= end:
                break
            f["t"] = self.strike(f, a)
            if f["t"] is None:
                f["error"] = "the fault never struck"
                self.console.say(f"fault {f['n']} {f['kind']}: never struck")
                done.append(f)
                break
            f["t_s"] = round(f["t"] - t0, 2)
            self.console.say(f"fault {f['n']}: {f['kind']} (rank {f['rank']}) at {f['t_s']} s, attempt {a.id}")
            done.append(f)
            if f["kind"] in rec.RESTARTING:
                prev = a.id
                b = self.wait_for(max(end, time.time() + RECOVER_TIMEOUT_S), lambda p=prev: self.training(p))
                if b is None:
                    f["error"] = "not recovered: the job did not train again"
                    self.console.say(f"fault {f['n']}: the job did not train again; stopping the soak")
                    break
                prev = None
                self.console.say(f"  training again: attempt {b.id} from step {b.resumed}")
            else:
                # A failed save is recovered by the next commit (no restart): strike nothing before it, or the
                # next fault's restart hides whether it came (a slow machine saw a hang land 2 s after a full disk).
                ok = self.wait_for(max(end, time.time() + RECOVER_TIMEOUT_S),
                                   lambda t_fault=f["t"]: any(t > t_fault for t in self.commits.values()))
                if ok is None:
                    self.console.say(f"fault {f['n']}: no checkpoint committed after it; stopping the soak")
                    break
                self.console.say("  committed again after the failed save")
        else:
            if self.args.faults:  # every fault asked for struck and was recovered: nothing left to wait for
                end = time.time()
        self.wait_for(end, lambda: False)
        exited = self.proc.poll() if self.proc is not None else None  # ended on its own, before the soak ended it
        t_end = self.stop()
        self.poll_commits()
        self.console.say(f"stopped after {t_end - t0:.0f} s")
        return {"t0": t0, "t_end": t_end, "faults": done, "job_exit": exited}
