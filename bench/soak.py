"""Chaos soak (issue #47): one `musubi train` job for a fixed wall time under a seeded stream of faults.

    python bench/soak.py --device cpu --nprocs 2 --minutes 3 --fault-every 20 --seed 0 --out /tmp/soak
    python bench/soak.py --device cuda --nprocs 2 --minutes 4 --fault-every 30 --seed 0 --out DIR   # GPUs
    python bench/soak.py ... --dry-run        # the job, the schedule and the expected wall time; starts nothing
    python bench/soak.py ... --faults 4       # the first 4 faults (one round of 4 kinds), ended once recovered
    python bench/soak.py --jobs 3 ...         # a fleet: 3 jobs at once, faults striking random jobs' ranks

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

A fleet (`--jobs N`, bench/soak_fleet.py): N launches of the job at once (OUT/job{i}/), each fault
`--fault-every` seconds after the previous one struck, on a random job (seeded), the others training on;
every job is checked as above (but the weights: one reference run per job would double the soak), and the
figures are given per job and in total (effective training time over the sum of the jobs' wall times).

Figures (bench/soak_records.py says where each comes from): effective training time (productive step
time / wall time), and per fault its recovery split into detection, teardown, restart, reload, first
step and lost steps; each restart's own parts (torchrun's rendezvous, the new interpreters, imports, process
group, task and batch, model, checkpoint load, loop set-up) from rank 0's start-up marks. Writes OUT/soak.json and OUT/soak.md (the table); exit 1 if a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: `bench` is a folder of the repository
    sys.path.insert(0, str(REPO))

from bench import soak_records as rec  # noqa: E402
from bench.soak_fleet import Fleet  # noqa: E402
from bench.soak_job import JOB_NAME, Soak  # noqa: E402

KINDS = ("kill", "hang", "nan", "oom", "disk_full", "torn", "preempt")


def default_job(device: str) -> dict[str, Any]:
    """The soak's job: a ResNet-18 classifier on generated images, deterministic, many restarts allowed.

    CPU: 32-pixel images, batch 8 per rank (a step of tens of ms on 2 gloo ranks). GPU: 64 pixels, batch 64
    per rank. bf16, so that a first NaN falls back to fp32; later ones retry in fp32 (recovery/numerics.py).
    """
    cpu = device == "cpu"
    return {
        "name": JOB_NAME, "task": "classification", "model": "resnet18",
        "data": {"synthetic": {"train_size": 4096 if cpu else 65536, "val_size": 0, "image_size": 32 if cpu else 64,
                               "num_classes": 10}, "workers": 0 if cpu else 2},
        "train": {"epochs": 10_000, "batch": 8 if cpu else 64, "lr": 0.02, "base_batch": 16 if cpu else 128,
                  "precision": "bf16", "deterministic": True, "max_restarts": 100, "log_every": 10,
                  "min_batch": 1},
        "checkpoint": {"every_steps": "auto", "keep_last": 3},
        "watchdog": {"floor_s": 10.0},
        "tracking": {"tensorboard": False},
    }


def soak_job(base: dict[str, Any]) -> dict[str, Any]:
    """A job made fit to soak: deterministic, restarts without end, never finishing within the soak."""
    job = json.loads(json.dumps(base))
    train = job.setdefault("train", {})
    train.update(deterministic=True, max_restarts=100, epochs=10_000)
    train.pop("max_steps", None)  # the soak ends the job, not its length
    job.setdefault("checkpoint", {}).setdefault("every_steps", "auto")  # Young/Daly, measured by the job
    return job


def schedule(kinds: list[str], nprocs: int, wall_s: float, every_s: float, seed: int, jobs: int = 1
             ) -> list[dict[str, Any]]:
    """Seeded faults: each `every_s` seconds (+-25 %) of training after the previous one's recovery (the first
    after the job's first step), kinds in shuffled rounds, a random rank each. As many as could fit
    if recoveries took no time; the soak's wall time ends the list. A fleet (`jobs` > 1): each fault `every_s`
    after the previous one struck, on a random job (drawn apart, so a job's faults are those of a lone soak)."""
    pick = random.Random(f"jobs-{seed}")
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
                    "phase": rng.choice(["forward", "backward"]) if kind == "oom" else None,
                    **({"job": pick.randrange(jobs)} if jobs > 1 else {})})
    return out


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


def fleet_result(fleet: Fleet, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each job analysed as a lone soak, and the fleet's sums: effective training time over every job's wall time,
    the faults of every job (each with its `job`), medians per kind and of the restart's parts, the problems."""
    jobs = [analyse(s, run) for s, run in zip(fleet.soaks, runs, strict=True)]
    faults = sorted((f for r in jobs for f in r["faults"]), key=lambda f: f["n"])
    wall = sum(r["wall_s"] for r in jobs)
    productive = sum(r["productive_s"] for r in jobs)
    return {"jobs": [{k: r[k] for k in ("wall_s", "productive_s", "effective_training_time", "attempts", "launches",
                                        "final_step", "commits", "silent_restarts", "lost_committed_checkpoints",
                                        "checkpoints", "problems")} | {"faults": len(r["faults"])} for r in jobs],
            "wall_s": round(max(r["wall_s"] for r in jobs), 2), "productive_s": round(productive, 2),
            "effective_training_time": round(productive / wall, 4) if wall > 0 else None,
            "effective_after_first_step": None,
            "attempts": sum(r["attempts"] for r in jobs), "launches": sum(r["launches"] for r in jobs),
            "final_step": [r["final_step"] for r in jobs],
            "silent_restarts": [f"job{i}: {a}" for i, r in enumerate(jobs) for a in r["silent_restarts"]],
            "lost_committed_checkpoints": sum(r["lost_committed_checkpoints"] for r in jobs),
            "checkpoints": [c for r in jobs for c in r["checkpoints"]],
            "numeric_faults": sorted({k for r in jobs for k in r["numeric_faults"]}),
            "by_kind": rec.by_kind([f for f in faults if f.get("recovery")]), "restart_split": rec.restart_split(faults),
            "faults": faults, "problems": [f"job{i}: {p}" for i, r in enumerate(jobs) for p in r["problems"]]}


@contextlib.contextmanager
def _launch_env(set_: dict[str, str], drop: tuple[str, ...]) -> Iterator[None]:
    """Within: the repository as the working folder, `set_` in the environment and `drop` out of it."""
    saved = {k: os.environ.get(k) for k in (*set_, *drop)}
    cwd = Path.cwd()
    os.environ.update(set_)
    for k in drop:
        os.environ.pop(k, None)
    os.chdir(REPO)
    try:
        yield
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def compare_reference(soak: Soak, result: dict[str, Any]) -> None:
    """An uninterrupted run to the soak's last committed step: the final weights must be equal, bit for bit."""
    from musubi.checkpoint.checkpoint import latest_checkpoint
    from musubi.launch.drill import final_tensors, flatten_tensors, same_weights

    last = latest_checkpoint(soak.job_dir / "checkpoints", warn=False)
    if last is None:
        result["reference"] = {"skipped": "no committed checkpoint"}
        return
    from musubi.launch.launch import launch_train
    from musubi.launch.request import TrainRequest

    ref_out = soak.out / "reference"
    argv = ["musubi", "train", str(soak.job_file), "--nproc", str(soak.args.nprocs), "--device", soak.args.device,
            "--out", str(ref_out), "--no-check", "--max-steps", str(last.step)]
    t = time.time()
    # Launched from this process, which reads the checkpoints with torch anyway (a `musubi train` subprocess imported it
    # again for its checks: seconds of CPU), with what the soak's own launches have: the repository as the working
    # folder and on PYTHONPATH (bench/soak_job.py), and no fault injection.
    with open(soak.out / "reference.log", "w", encoding="utf-8") as f, _launch_env(
            {"PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}, drop=("MUSUBI_INJECT",)):
        f.write(" ".join(argv) + "\n")
        res = launch_train(TrainRequest(job_path=soak.job_file, nproc=soak.args.nprocs, out=ref_out,
                                        device=soak.args.device, check=False, quiet=True, max_steps=last.step,
                                        argv=argv, say=lambda line: f.write(line + "\n")))
        f.write(f"exit {res.code}" + (f": {res.error}" if res.error else "") + "\n")
    code = res.code
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
    fleet = result.get("jobs")
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
             *([f"A fleet of {len(fleet)} jobs (effective training time: productive step time of every job / the "
                "sum of their wall times):", "",
                "| job | faults | attempts | launches | final step | effective | silent restarts | lost commits | "
                "checks |", "|---|---|---|---|---|---|---|---|---|",
                *(f"| job{i} | {j['faults']} | {j['attempts']} | {j['launches']} | {j['final_step']} | "
                  f"{_pct(j['effective_training_time'])} | {len(j['silent_restarts'])} | "
                  f"{j['lost_committed_checkpoints']} | {'passed' if not j['problems'] else 'FAILED'} |"
                  for i, j in enumerate(fleet)), ""] if fleet else []),
             "| # | fault | rank | at s | detection s | teardown s | restart s | reload s (load) | first step s | "
             "fault → step s | lost steps (s) | ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in result["faults"]:
        r = f.get("recovery") or {}
        ok = "yes" if r.get("recovered") and r.get("detected") else "NO"
        extra = f" (next commit {_fmt(r.get('next_commit_s'))} s)" if f["kind"] == "disk_full" else ""
        extra += f" on job{f['job']}" if "job" in f else ""
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
        used = c.get("auto")
        saved = (f"the job's auto cadence chose {used['choices']} time(s): every {used['every_steps_median']} steps "
                 f"(median; first {used['first_every_steps']} at M {used['first_mtbf_s']:,.0f} s ({used['first_mtbf_from']}), "
                 f"last {used['last_every_steps']}), {used['saves']} save(s) measured"
                 if used else f"the job saved every {c['configured_every_steps']}")
        lines += ["", f"Checkpoint cadence (Young/Daly, τ = √(2·δ·M)): δ = {c['save_cost_s']} s per save "
                  f"({c['save_cost_from']}), M = {c['mtbf_s']} s between faults → every {c['interval_s']} s ≈ "
                  f"{c['every_steps']} steps; {saved}."]
    return "\n".join(lines) + "\n"


def cadence(soak: Soak, result: dict[str, Any], faults: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Young/Daly's checkpoint interval from this soak's measured save cost and fault rate, beside what the job's
    auto cadence chose (JOB/cadence.jsonl). The save cost: the job's own measure where it made one (the step
    blocked + the slower steps while the save was written), else the time the step was blocked."""
    from musubi.plan.cadence import young_daly_interval

    blocked = [float(r["blocked_s"]) for r in _metrics(soak.job_dir) if r.get("kind") == "checkpoint"
               and r.get("ok") and "blocked_s" in r]
    steps = [r for a in soak.attempts() for r in a.steps]
    struck = [f for f in faults if f.get("t") is not None]
    if not blocked or len(struck) < 1 or len(steps) < 2:
        return None
    from musubi.contract.run_files import RUN_FILES

    records = _metrics(soak.job_dir, RUN_FILES.cadence)
    choices = [r for r in records if r.get("event") == "choice"]
    measured = [(r["cost_s"], r["blocked_s"], r["slowed_s"]) for r in records if r.get("event") == "save"]
    if measured:
        delta = rec.median([m[0] for m in measured])
        delta_from = (f"the job's measure over {len(measured)} save(s): step blocked "
                      f"{rec.median([m[1] for m in measured])} s + slower steps {rec.median([m[2] for m in measured])} s")
    else:
        delta, delta_from = rec.median(blocked), "blocked"
    mtbf = result["wall_s"] / len(struck)
    tau = young_daly_interval(delta, mtbf)
    times = sorted(t for t, _ in steps)
    step_s = rec.median([b - a for a, b in zip(times, times[1:], strict=False) if 0 < b - a < 5]) or 0.0
    spec = yaml.safe_load(soak.job_file.read_text(encoding="utf-8"))
    auto = {"choices": len(choices), "every_steps_median": rec.median([c["every_steps"] for c in choices]),
            "first_every_steps": choices[0]["every_steps"], "first_mtbf_s": choices[0]["mtbf_s"],
            "first_mtbf_from": choices[0]["mtbf_from"], "last_every_steps": choices[-1]["every_steps"],
            "saves": len(measured)} if choices else None
    return {"save_cost_s": round(delta, 4), "save_cost_from": delta_from, "mtbf_s": round(mtbf, 1),
            "interval_s": round(tau, 2), "step_s": step_s,
            "every_steps": max(1, round(tau / step_s)) if step_s else None,
            "configured_every_steps": spec.get("checkpoint", {}).get("every_steps"), "auto": auto}


def _metrics(job_dir: Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    path = job_dir / name
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
    """The commit measured: MUSUBI_COMMIT where the caller names it (a copied tree's .git may be stale), else git."""
    if os.environ.get("MUSUBI_COMMIT"):
        return os.environ["MUSUBI_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The soak's options, checked; the fault kinds."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--nprocs", type=int, default=2, help="ranks of the job")
    ap.add_argument("--jobs", type=int, default=1, help="soak a fleet of this many jobs at once (each --nprocs "
                    "ranks); faults strike random jobs, --fault-every apart")
    ap.add_argument("--minutes", type=float, default=3.0, help="wall time of the soak (the job under faults)")
    ap.add_argument("--fault-every", type=float, default=30.0,
                    help="seconds of training between a recovery and the next fault (+-25 %%, seeded)")
    ap.add_argument("--faults", type=int, default=0,
                    help="strike the schedule's first N faults and end the soak once the last is recovered "
                    "(--minutes stays the upper bound); 0: as many as --minutes holds")
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
    if args.nprocs < 1 or args.jobs < 1 or args.minutes <= 0 or args.fault_every <= 0:
        ap.error("--nprocs, --jobs, --minutes and --fault-every must be positive")
    if args.faults < 0 or args.faults > args.minutes * 60 // (0.75 * args.fault_every):
        ap.error(f"--faults {args.faults}: give 0 (as many as the minutes hold) up to "
                 f"{int(args.minutes * 60 // (0.75 * args.fault_every))} at --minutes {args.minutes:g} and "
                 f"--fault-every {args.fault_every:g}; or raise --minutes")
    if args.out.exists() and any(args.out.iterdir()) and not args.dry_run:
        ap.error(f"--out {args.out}: not empty; choose a new folder")
    return args, kinds


def build_job(args: argparse.Namespace) -> dict[str, Any]:
    """The soaked job: --job or the built-in one, made fit to soak, --set applied."""
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
    return job


def print_plan(args: argparse.Namespace, job: dict[str, Any], faults: list[dict[str, Any]], command: str,
               reference: bool) -> None:
    """--dry-run: the job, the schedule and the expected wall time."""
    print(f"soak plan: {command}")
    what = f"{args.jobs} jobs of " if args.jobs > 1 else ""
    print(f"job ({what}{args.nprocs} {args.device} rank(s)):\n" + yaml.safe_dump(job, sort_keys=False).rstrip())
    print(f"faults ({len(faults)}, seed {args.seed}):")
    print("  (each: seconds after the previous fault " + ("struck, on a random job" if args.jobs > 1 else
                                                          "'s recovery") + "; the wall time ends the list)")
    for f in faults:
        who = "" if f["kind"] in ("disk_full", "preempt") else f" rank {f['rank']}"
        on = f" on job{f['job']}" if "job" in f else ""
        print(f"  +{f['gap_s']:5.1f} s  {f['kind']}{who}{on}" + (f" ({f['phase']})" if f.get("phase") else ""))
    print(f"expected wall time: {'at most ' if args.faults else ''}{args.minutes * 60:.0f} s of soak"
          + (f" (it ends once the {args.faults} faults are recovered)" if args.faults else "")
          + " + ~30 s of stop and checks"
          + (" + an uninterrupted reference run (at most the soak's productive time)" if reference else
             " (no reference run: " + ("--no-reference" if args.no_reference else "a fleet" if args.jobs > 1 else
                                       "numeric faults change the weights") + ")"))


def main(argv: list[str] | None = None) -> int:
    args, kinds = parse_args(argv)
    job = build_job(args)
    wall_s = args.minutes * 60
    faults = schedule(kinds, args.nprocs, wall_s, args.fault_every, args.seed, args.jobs)
    if args.faults:  # the first N; the soak ends once they are recovered (Soak.run, Fleet.run)
        faults = faults[:args.faults]
    numeric = any(f["kind"] in rec.NUMERIC for f in faults)
    # A fleet checks every job's checkpoints, not the weights (one reference run per job would double its time).
    reference = not args.no_reference and not numeric and args.jobs == 1
    command = "python bench/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        print_plan(args, job, faults, command, reference)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    job_file = args.out / "soak-job.yaml"
    job_file.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    head = {"command": command, "card": _card(args.device), "commit": _commit(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "device": args.device, "nprocs": args.nprocs, "jobs_n": args.jobs, "seed": args.seed, "kinds": kinds,
            "fault_every_s": args.fault_every, "faults_asked": args.faults or None}
    if args.jobs > 1:
        fleet = Fleet(args, job_file, args.out, args.jobs)
        result = {**head, **fleet_result(fleet, fleet.run(faults, wall_s))}
    else:
        soak = Soak(args, job_file, args.out)
        result = {**head, **analyse(soak, soak.run(faults))}
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
