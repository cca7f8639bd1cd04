"""Chaos soak (issue #47): one `musubi train` job for a fixed wall time under a seeded stream of faults.

    python bench/soak.py --device cpu --nprocs 2 --minutes 3 --fault-every 20 --seed 0 --out /tmp/soak
    python bench/soak.py --device cuda --nprocs 2 --minutes 4 --fault-every 30 --seed 0 --out DIR   # GPUs
    python bench/soak.py ... --dry-run        # the job, the schedule and the expected wall time; starts nothing

Faults (`--kinds`, default all), one at a time, in shuffled rounds so that every kind comes up:

    kill       SIGKILL of a rank (from outside: the pid its heartbeat file names)
    hang       SIGSTOP of a rank (from outside): the peers' watchdogs must notice and end the attempt
    nan        a NaN loss on a rank       (inside: MUSUBI_INJECT `armed`, musubi/contract/inject.py)
    oom        a real torch.OutOfMemoryError in forward or backward of a rank (inside)
    disk_full  the next checkpoint fails with ENOSPC on every rank (inside): training must go on
    torn       the writer killed mid-save, a truncated shard left behind (inside: ckpt_kill phase=write)
    preempt    SIGTERM to the job's whole process group, then `musubi train --resume`

Real faults come from outside (signals to real processes); the ones that must happen inside a rank go
through the injection switch (`MUSUBI_INJECT=armed`: the soak drops `armed-N.txt` files into
JOB/logs/inject/, each rank reads them at its step ends). Faults come one at a time: each strikes
`--fault-every` seconds (+-25 %, seeded) of training after the job recovered from the previous one (the
first after the job's first step), so each recovery is measured whole and the job trains between
faults whatever a recovery costs on the machine. At the end the job is stopped (SIGTERM) and checked:

- every fault was detected and recovered, and no restart happened that no fault explains (silent);
- no committed checkpoint was lost (each restart resumed from the newest one committed before its fault);
- every committed checkpoint left loads, and its step and data position agree;
- without numeric faults (nan, oom), the final weights equal an uninterrupted run's to the same step
  (deterministic mode; `--no-reference` skips that run).

Figures (bench/soak_records.py says where each comes from): effective training time (productive step
time / wall time), and per fault its recovery split into detection, teardown, restart, reload, first
step and lost steps. Writes OUT/soak.json and OUT/soak.md (the table); exit 1 if a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: `bench` is a folder of the repository
    sys.path.insert(0, str(REPO))

from bench import soak_records as rec  # noqa: E402

KINDS = ("kill", "hang", "nan", "oom", "disk_full", "torn", "preempt")
#: Seconds a fault may take to strike (an armed checkpoint fault waits for the next save) or to be recovered
#: from before the soak stops and reports it as not recovered.
STRIKE_TIMEOUT_S = 60.0
RECOVER_TIMEOUT_S = 180.0
JOB_NAME = "soak"


def default_job(device: str) -> dict[str, Any]:
    """The soak's job: a ResNet-18 classifier on generated images, deterministic, many restarts allowed.

    CPU: 32-pixel images, batch 8 per rank (a step of tens of ms on 2 gloo ranks). GPU: 64 pixels, batch 64
    per rank. bf16 so that a NaN falls back to fp32 (in fp32 there is nothing safer: see recovery/numerics.py).
    """
    cpu = device == "cpu"
    return {
        "name": JOB_NAME, "task": "classification", "model": "resnet18",
        "data": {"synthetic": {"train_size": 4096 if cpu else 65536, "val_size": 0, "image_size": 32 if cpu else 64,
                               "num_classes": 10}, "workers": 0 if cpu else 2},
        "train": {"epochs": 10_000, "batch": 8 if cpu else 64, "lr": 0.02, "base_batch": 16 if cpu else 128,
                  "precision": "bf16", "deterministic": True, "max_restarts": 100, "log_every": 10,
                  "min_batch": 1},
        "checkpoint": {"every_steps": 25 if cpu else 100, "keep_last": 3},
        "watchdog": {"floor_s": 10.0},
        "tracking": {"tensorboard": False},
    }


def soak_job(base: dict[str, Any]) -> dict[str, Any]:
    """A job made fit to soak: deterministic, restarts without end, never finishing within the soak."""
    job = json.loads(json.dumps(base))
    train = job.setdefault("train", {})
    train.update(deterministic=True, max_restarts=100, epochs=10_000)
    train.pop("max_steps", None)  # the soak ends the job, not its length
    job.setdefault("checkpoint", {}).setdefault("every_steps", 25)
    return job


def schedule(kinds: list[str], nprocs: int, wall_s: float, every_s: float, seed: int) -> list[dict[str, Any]]:
    """Seeded faults: each `every_s` seconds (+-25 %) of training after the previous one's recovery (the first
    after the job's first step), kinds in shuffled rounds, a random rank each. As many as could fit
    if recoveries took no time; the soak's wall time ends the list."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    bag: list[str] = []
    for n in range(1, int(wall_s // (0.75 * every_s)) + 1):
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        kind = bag.pop()
        out.append({"n": n, "kind": kind, "gap_s": round(every_s * (1 + rng.uniform(-0.25, 0.25)), 1),
                    "rank": rng.randrange(nprocs),
                    "phase": rng.choice(["forward", "backward"]) if kind == "oom" else None})
    return out


class Soak:
    """Drives one job: launches, injects, relaunches after a preemption, watches commits, stops it."""

    def __init__(self, args: argparse.Namespace, job_file: Path, out: Path) -> None:
        self.args, self.job_file, self.out = args, job_file, out
        self.run_dir = out / "run"
        self.job_dir = self.run_dir / JOB_NAME
        self.proc: subprocess.Popen | None = None
        self.commits: dict[int, float] = {}  # step -> commit time (marker), every checkpoint ever committed
        self.launch_exits: list[float] = []
        self.log = open(out / "soak.log", "a", encoding="utf-8")  # noqa: SIM115 - the soak's own console

    def say(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

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
        self.say(f"launched {JOB_NAME} on {self.args.nprocs} {self.args.device} rank(s); {len(faults)} fault(s) "
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
                self.say(f"fault {f['n']} {f['kind']}: never struck")
                done.append(f)
                break
            f["t_s"] = round(f["t"] - t0, 2)
            self.say(f"fault {f['n']}: {f['kind']} (rank {f['rank']}) at {f['t_s']} s, attempt {a.id}")
            done.append(f)
            if f["kind"] in rec.RESTARTING:
                prev = a.id
                b = self.wait_for(max(end, time.time() + RECOVER_TIMEOUT_S), lambda p=prev: self.training(p))
                if b is None:
                    f["error"] = "not recovered: the job did not train again"
                    self.say(f"fault {f['n']}: the job did not train again; stopping the soak")
                    break
                prev = None
                self.say(f"  training again: attempt {b.id} from step {b.resumed}")
        self.wait_for(end, lambda: False)
        exited = self.proc.poll() if self.proc is not None else None  # ended on its own, before the soak ended it
        t_end = self.stop()
        self.poll_commits()
        self.say(f"stopped after {t_end - t0:.0f} s")
        return {"t0": t0, "t_end": t_end, "faults": done, "job_exit": exited}


def analyse(soak: Soak, run: dict[str, Any]) -> dict[str, Any]:
    """Recovery per fault, effective training time and the consistency checks, from the run's records."""
    job_dir = soak.job_dir
    attempts = soak.attempts()
    year = time.localtime(run["t0"]).tm_year
    torchrun = rec.torchrun_events(job_dir, year)
    rank0 = rec.rank_log_events(job_dir, 0)
    faults = run["faults"]
    for f in faults:
        if f.get("t") is None:
            continue
        exits = [t for t in soak.launch_exits if t >= f["t"]]
        f["recovery"] = rec.recovery(job_dir, f, attempts, torchrun, rank0, soak.commits,
                                     exits[0] if exits else None)
    wall = run["t_end"] - run["t0"]
    productive = rec.productive_seconds(attempts)
    first_train = next((a.train_start for a in attempts if a.train_start is not None), None)
    problems: list[str] = []
    if run.get("job_exit") is not None:
        problems.append(f"the job ended on its own (exit {run['job_exit']}) before the soak's end; see train.log")
    for f in faults:
        r = f.get("recovery") or {}
        if f.get("error"):
            problems.append(f"fault {f['n']} ({f['kind']}): {f['error']}")
        elif not r.get("detected"):
            problems.append(f"fault {f['n']} ({f['kind']}): not detected in the job's records")
        elif not r.get("recovered"):
            problems.append(f"fault {f['n']} ({f['kind']}): not recovered")
    silent = rec.silent_restarts(attempts, [f for f in faults if f.get("recovery")])
    problems += [f"silent restart: attempt {s} follows no injected fault" for s in silent]
    lost = rec.lost_commits([f for f in faults if f.get("recovery")], soak.commits, job_dir)
    problems += lost
    steps_per_epoch = _steps_per_epoch(job_dir)
    ck = rec.checkpoint_checks(job_dir, steps_per_epoch)
    problems += ck["problems"]
    numeric = sorted({f["kind"] for f in faults if f["kind"] in rec.NUMERIC and f.get("t") is not None})
    return {"wall_s": round(wall, 2), "productive_s": round(productive, 2),
            "effective_training_time": round(productive / wall, 4) if wall > 0 else None,
            "effective_after_first_step": round(productive / (run["t_end"] - first_train), 4) if first_train else None,
            "attempts": len(attempts), "launches": len({a.id.split(".")[0] for a in attempts}),
            "final_step": max((s for s in soak.commits), default=0),
            "steps_per_epoch": steps_per_epoch, "commits": len(soak.commits),
            "silent_restarts": silent, "lost_committed_checkpoints": len(lost),
            "checkpoints": ck["checkpoints"], "numeric_faults": numeric,
            "by_kind": rec.by_kind([f for f in faults if f.get("recovery")]),
            "restart_split": rec.restart_split(faults),
            "faults": faults, "problems": problems}


def _steps_per_epoch(job_dir: Path) -> int | None:
    import re

    for _, msg in rec.rank_log_events(job_dir, 0):
        m = re.search(r"\((\d+) per epoch\)", msg)
        if m:
            return int(m.group(1))
    return None


def compare_reference(soak: Soak, result: dict[str, Any]) -> None:
    """An uninterrupted run to the soak's last committed step: the final weights must be equal, bit for bit."""
    from musubi.checkpoint.checkpoint import latest_checkpoint
    from musubi.launch.drill import final_tensors, flatten_tensors, same_weights

    last = latest_checkpoint(soak.job_dir / "checkpoints", warn=False)
    if last is None:
        result["reference"] = {"skipped": "no committed checkpoint"}
        return
    ref_out = soak.out / "reference"
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("MUSUBI_INJECT", None)
    cmd = [sys.executable, "-m", "musubi.cli", "train", str(soak.job_file), "--nproc", str(soak.args.nprocs),
           "--device", soak.args.device, "--out", str(ref_out), "--no-check", "--max-steps", str(last.step)]
    t = time.time()
    with open(soak.out / "reference.log", "w", encoding="utf-8") as f:
        code = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    from musubi.checkpoint.checkpoint import read_full_state

    mine = flatten_tensors({k: v for k, v in read_full_state(last.path).items() if k in ("model", "optim")})
    ref = final_tensors(ref_out / JOB_NAME) if code == 0 else {}
    equal = same_weights(mine, ref)
    result["reference"] = {"step": last.step, "exit_code": code, "wall_s": round(time.time() - t, 1),
                           "weights_equal": equal}
    if not equal:
        result["problems"].append(f"final weights at step {last.step} differ from an uninterrupted run's"
                                  + ("" if code == 0 else f" (the reference run failed: exit {code})"))


def _fmt(x: Any) -> str:
    return "—" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def markdown(result: dict[str, Any]) -> str:
    """The soak as tables: the summary, each fault's recovery split, the medians per kind."""
    lines = [f"Soak: {result['command']}", "",
             f"- card: {result['card']}; commit {result['commit']}; {result['date']}",
             f"- wall {result['wall_s']:.0f} s, {len(result['faults'])} fault(s), {result['attempts']} attempt(s) in "
             f"{result['launches']} launch(es); final committed step {result['final_step']}",
             f"- **effective training time {_pct(result['effective_training_time'])}** (productive step time "
             f"{result['productive_s']:.0f} s / wall); after the first step: {_pct(result['effective_after_first_step'])}",
             f"- silent restarts: {len(result['silent_restarts'])}; lost committed checkpoints: "
             f"{result['lost_committed_checkpoints']}; committed checkpoints left that load: "
             f"{sum(c.get('loads', False) for c in result['checkpoints'])}/{len(result['checkpoints'])}",
             f"- final weights = uninterrupted run: {_fmt((result.get('reference') or {}).get('weights_equal'))}"
             + ("" if result.get("reference") else f" (not compared: numeric faults {', '.join(result['numeric_faults'])})"
                if result["numeric_faults"] else ""),
             f"- checks: {'all passed' if not result['problems'] else '; '.join(result['problems'])}", "",
             "| # | fault | rank | at s | detection s | teardown s | restart s | reload s (load) | first step s | "
             "fault → step s | lost steps (s) | ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in result["faults"]:
        r = f.get("recovery") or {}
        ok = "yes" if r.get("recovered") and r.get("detected") else "NO"
        extra = f" (next commit {_fmt(r.get('next_commit_s'))} s)" if f["kind"] == "disk_full" else ""
        lines.append(f"| {f['n']} | {f['kind']}{extra} | {f['rank'] if f['kind'] not in ('disk_full', 'preempt') else '—'}"
                     f" | {_fmt(f.get('t_s'))} | {_fmt(r.get('detection_s'))} | {_fmt(r.get('teardown_s'))} | "
                     f"{_fmt(r.get('restart_s'))} | {_fmt(r.get('reload_s'))} ({_fmt(r.get('load_checkpoint_s'))}) | "
                     f"{_fmt(r.get('first_step_s'))} | {_fmt(r.get('fault_to_step_s'))} | {_fmt(r.get('lost_steps'))} "
                     f"({_fmt(r.get('lost_s'))}) | {ok} |")
    lines += ["", "| fault | n | recovered | detection | teardown | restart | reload | first step | fault → step | "
              "lost steps | lost s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind, k in result["by_kind"].items():
        lines.append(f"| {kind} | {k['faults']} | {k['recovered']} | " + " | ".join(
            _fmt(k[x]) for x in rec.SPLIT) + " |")
    lines += ["", "Medians in seconds. Where each figure comes from: bench/soak_records.py."]
    split = result.get("restart_split") or {}
    if any(v is not None for v in split.values()):
        names = [name for name, _, _ in rec.RESTART_PARTS]
        lines += ["", "Where a restart's time goes (medians over every restart, s; rank 0's start-up marks):", "",
                  "| " + " | ".join(n.removesuffix("_s") for n in names) + " |", "|" + "---|" * len(names),
                  "| " + " | ".join(_fmt(split.get(n)) for n in names) + " |"]
    if result.get("cadence"):
        c = result["cadence"]
        lines += ["", f"Checkpoint cadence (Young/Daly, τ = √(2·δ·M)): δ = {c['save_cost_s']} s blocked per save, "
                  f"M = {c['mtbf_s']} s between faults → every {c['interval_s']} s ≈ {c['every_steps']} steps "
                  f"(the job saved every {c['configured_every_steps']})."]
    return "\n".join(lines) + "\n"


def cadence(soak: Soak, result: dict[str, Any], faults: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Young/Daly's checkpoint interval from this soak's measured save cost and fault rate."""
    from musubi.plan.cadence import young_daly_interval

    blocked = [float(r["blocked_s"]) for r in _metrics(soak.job_dir) if r.get("kind") == "checkpoint"
               and r.get("ok") and "blocked_s" in r]
    steps = [r for a in soak.attempts() for r in a.steps]
    struck = [f for f in faults if f.get("t") is not None]
    if not blocked or len(struck) < 1 or len(steps) < 2:
        return None
    delta = rec.median(blocked)
    mtbf = result["wall_s"] / len(struck)
    tau = young_daly_interval(delta, mtbf)
    times = sorted(t for t, _ in steps)
    step_s = rec.median([b - a for a, b in zip(times, times[1:], strict=False) if 0 < b - a < 5]) or 0.0
    spec = yaml.safe_load(soak.job_file.read_text(encoding="utf-8"))
    return {"save_cost_s": delta, "mtbf_s": round(mtbf, 1), "interval_s": round(tau, 2), "step_s": step_s,
            "every_steps": max(1, round(tau / step_s)) if step_s else None,
            "configured_every_steps": spec.get("checkpoint", {}).get("every_steps")}


def _metrics(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "metrics.jsonl"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _card(device: str) -> str:
    import platform

    if device == "cuda":
        try:
            names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                   text=True, timeout=20).stdout.split("\n")
            return ", ".join(n for n in names if n.strip())
        except (OSError, subprocess.SubprocessError):
            return "cuda (nvidia-smi unavailable)"
    return f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--nprocs", type=int, default=2, help="ranks of the job")
    ap.add_argument("--minutes", type=float, default=3.0, help="wall time of the soak (the job under faults)")
    ap.add_argument("--fault-every", type=float, default=30.0,
                    help="seconds of training between a recovery and the next fault (+-25 %%, seeded)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {', '.join(KINDS)}")
    ap.add_argument("--out", type=Path, required=True, help="an empty or new folder")
    ap.add_argument("--job", type=Path, default=None, help="a job YAML to soak instead of the built-in ResNet-18")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                    help="override a job field (dotted key), e.g. checkpoint.every_steps=50")
    ap.add_argument("--no-reference", action="store_true", help="skip the uninterrupted run (the weights check)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        ap.error(f"--kinds {args.kinds!r}: use a comma list of {', '.join(KINDS)}")
    if args.nprocs < 1 or args.minutes <= 0 or args.fault_every <= 0:
        ap.error("--nprocs, --minutes and --fault-every must be positive")
    if args.out.exists() and any(args.out.iterdir()) and not args.dry_run:
        ap.error(f"--out {args.out}: not empty; choose a new folder")
    base = yaml.safe_load(args.job.read_text(encoding="utf-8")) if args.job else default_job(args.device)
    job = soak_job(base)
    job["name"] = JOB_NAME
    for kv in args.overrides:
        key, _, value = kv.partition("=")
        node = job
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(value)
    wall_s = args.minutes * 60
    faults = schedule(kinds, args.nprocs, wall_s, args.fault_every, args.seed)
    numeric = any(f["kind"] in rec.NUMERIC for f in faults)
    reference = not args.no_reference and not numeric
    command = "python bench/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        print(f"soak plan: {command}")
        print(f"job ({args.nprocs} {args.device} rank(s)):\n" + yaml.safe_dump(job, sort_keys=False).rstrip())
        print(f"faults ({len(faults)}, seed {args.seed}):")
        print("  (each: seconds of training after the previous fault's recovery; the wall time ends the list)")
        for f in faults:
            who = "" if f["kind"] in ("disk_full", "preempt") else f" rank {f['rank']}"
            print(f"  +{f['gap_s']:5.1f} s  {f['kind']}{who}" + (f" ({f['phase']})" if f.get("phase") else ""))
        print(f"expected wall time: {wall_s:.0f} s of soak + ~30 s of stop and checks"
              + (" + an uninterrupted reference run (at most the soak's productive time)" if reference else
                 " (no reference run: " + ("--no-reference" if args.no_reference else "numeric faults change the "
                                           "weights") + ")"))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    job_file = args.out / "soak-job.yaml"
    job_file.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    soak = Soak(args, job_file, args.out)
    run = soak.run(faults)
    result = {"command": command, "card": _card(args.device), "commit": _commit(),
              "date": time.strftime("%Y-%m-%d %H:%M"), "device": args.device, "nprocs": args.nprocs,
              "seed": args.seed, "kinds": kinds, "fault_every_s": args.fault_every, **analyse(soak, run)}
    if reference and not any(f["kind"] in rec.NUMERIC for f in result["faults"]):
        compare_reference(soak, result)
    result["cadence"] = cadence(soak, result, result["faults"])
    result["ok"] = not result["problems"]
    (args.out / "soak.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    table = markdown(result)
    (args.out / "soak.md").write_text(table, encoding="utf-8")
    print(table)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
