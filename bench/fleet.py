"""Fleet makespan: `musubi run` against (a) every job alone on one GPU in sequence and
(b) the seed's way, every job in sequence on all GPUs (single-GPU-only jobs alone).

    python bench/fleet.py [--fleet bench/fleet-bench.yaml] [--modes a,b,fleet] [--device cuda|cpu]
                          [--cpu-slots N] [--json OUT.json] [--svg OUT.svg] [--a-parallel]

The same jobs (same data, epochs and per-rank batch) run in every mode; the
fleet packs them onto the GPUs side by side. The fleet's makespan also holds
each job's evaluation step (FPS, metrics) and the export/registration at the
end, which (a) and (b) skip: the comparison is conservative for the fleet.
Plumbing checked on CPU slots with tiny jobs (where start-up and evaluation
dominate, so the ratio says nothing); on 4x H200 (2026-11-27, BENCHMARKS.md session 9) (a) and the fleet
ran, (b) not yet. Prints the makespans, the speedup
of the fleet over (a) (target: at least 0.90 x the number of GPUs) and over (b).

Two more cases, each two fleet runs of its own file in one call (`--modes share`, `--modes pin`; the
`report` JSON gets a "share" or "pin" section):

    python bench/fleet.py --modes share [--share-fleet bench/fleet-share-2gpu.yaml] --json OUT.json --svg OUT.svg
    python bench/fleet.py --modes pin [--pin-fleet bench/fleet-pin-2gpu.yaml] [--pin-images 1024] --json OUT.json

- share: small single-GPU jobs with machine.share_gpus off (one a GPU; their utilisation and peak memory
  recorded in the store), then auto beside it (the same store: the plan shares where the measurements
  allow). Reports both makespans, the gain, which jobs shared, each job's measured utilisation and peak,
  and each job's seconds alone against shared (its real slowdown; the model predicts 1 + the other's utilisation).
- pin: JPEG-decoding detectors side by side, machine.pin_cpus true then false, on JPEG files written first.
  Reports both makespans and each job's median samples/s in both runs.
`--work DIR` keeps the runs, the store and each finished mode's figures (DIR/modes.json) in DIR, so the modes
of a time-limited GPU machine can be measured in separate calls on the same machine (a, then fleet, then b):
the figures add up and the fleet plans from the history the earlier calls recorded.
`--copies K`: the fleet modes run every job K times (NAME, NAME-c2, ...; copy c waits for copy c of what it
waits for): a fleet of more jobs than GPUs, as teams run them (RGB and thermal variants of each model). The
copies are the same work, so (a) and (b) measure each job once and count it K times (report
"makespan_s_of_copies"; the speedups use them), and each measured run is the history of its copies too.
`--only NAME,...`: every mode runs only these jobs of the file (what waits for a job left out no longer does).
`--modes ...,a-again`: (a) once more, after the fleet, into its own folder: each job's second run alone against
its first says how far the machine drifted between them, so a job slower in the fleet than in (a) is told apart
from a machine that got slower (4x H200, 2026-11-27: fcos and the external detectors ran 1.09-1.26x slower in the
fleet, the GPU-bound jobs 0.99-1.01x, with (a) and the fleet in separate calls). Both also split each fleet job
against the second (a).
Rehearsed on CPU (2 slots, a tiny task job and an external one, K = 2). bench/fleet_whatif.py --copies K predicts it
from a GPU store first.
Before the first mode every GPU gets an untimed warm-up (the imports of a job, a few seconds of matmuls;
`--no-warm-up` skips it): on a freshly started machine the first (a) measured a cold machine (2026-11-27).
`--small`: CPU rehearsal sizes (a few steps, small frames); on CPU slots no GPU is shared, so the share case
only proves the plumbing there.

The duration model (musubi/fleet/durations.py) is checked on the way: every job (a) and (b) run is
recorded in the store beside the fleet's run folder as history of that job on this machine (width 1 from
(a), all GPUs from (b)), so with the default order a,b,fleet the fleet plans from measured durations and
fitted scaling. After the fleet, each job's predicted and measured seconds (on the width the fleet gave
it) and the predicted and measured makespan are printed; `--svg` draws both timelines. (a) and (b) time
`musubi train` alone, without the fleet's evaluation step: predictions from them run short by that step
(CPU, tiny jobs: 3-4 s a job); the fleet's own history (a second fleet run) includes it.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.warm_up import warm_up  # noqa: E402
from musubi.config.fleet import CommandJob, TaskJob  # noqa: E402
from musubi.config.load import load_fleet  # noqa: E402
from musubi.diagnose.fleet_view import svg_timeline  # noqa: E402
from musubi.fleet.durations import job_key, machine_of, record_run  # noqa: E402
from musubi.fleet.gpu_watch import stop_watching, watch_command  # noqa: E402
from musubi.fleet.jobs import gpu_env, pin_process, resolve_command, union_cpus  # noqa: E402
from musubi.fleet.machine import cpus_value, device_cores  # noqa: E402
from musubi.fleet.moldable import Bar  # noqa: E402
from musubi.fleet.replay import replay  # noqa: E402
from musubi.fleet.timeline import text_timeline  # noqa: E402
from musubi.records.attempts import attempts_of  # noqa: E402
from musubi.store.db import db_path  # noqa: E402
from musubi.store.startup import components, marks_of, summary_line  # noqa: E402
from musubi.topology.read import read_node_topology  # noqa: E402


def _run(argv: list[str], env: dict[str, str], cwd: Path, pin: tuple[int, ...] = (),
         watch: tuple[Path, list[int]] | None = None, accept=lambda code: code == 0) -> float:
    """Seconds one command took (`pin`: the cores it is pinned to, as the fleet pins an external job; `watch`:
    (job folder, GPUs) the fleet samples for an external job, for its utilisation and peak memory); raises
    when it fails (`accept(exit code)` False)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pin_process(proc.pid, pin)
    samplers = watch_command(watch[0], proc.pid, watch[1]) if watch else []
    stdout, stderr = proc.communicate()
    stop_watching(samplers)
    if not accept(proc.returncode):
        raise RuntimeError(f"{argv[:6]} failed ({proc.returncode}):\n{stdout[-1500:]}\n{stderr[-1500:]}")
    if proc.returncode != 0:
        print(f"  exit {proc.returncode}, counted: {(stdout + stderr).strip()[-300:]}", flush=True)
    return time.perf_counter() - t0


def all_done(run_dir: Path) -> bool:
    """Whether every job of the fleet in `run_dir` ended well (fleet.json): a fleet that then missed its
    success criteria (exit 1: an export check, say) still ran its jobs to the end, and its makespan counts."""
    try:
        jobs = json.loads((run_dir / "fleet.json").read_text()).get("jobs") or {}
    except (OSError, ValueError):
        return False
    return bool(jobs) and all(j.get("state") == "done" for j in jobs.values())


def run_fleet(fleet: Path, out: Path, device: str, slots: int | None, overlap: bool = True,
              machine: dict | None = None, subst: dict[str, str] | None = None, small: bool = False) -> float:
    """The fleet's makespan (training, evaluation and shipping included); `overlap` False: machine.overlap off;
    `machine`: more machine: settings; `subst`: text replaced in the file ($JPEGS); `small`: CPU rehearsal sizes
    (a copy of the fleet file beside it, removed after)."""
    copy = None
    if not overlap or machine or subst or small:
        text = fleet.read_text()
        for k, v in (subst or {}).items():
            text = text.replace(k, v)
        data = yaml.safe_load(text)
        data.setdefault("machine", {}).update(machine or {})
        if not overlap:
            data["machine"]["overlap"] = False
        if small:
            shrink(data)
        copy = derived_fleet(fleet, out.name, data)
    argv = [sys.executable, "-m", "musubi.cli", "run", str(copy or fleet), "--out", str(out), "--device", device,
            "--no-check"]
    if slots:
        argv += ["--cpu-slots", str(slots)]
    try:
        # Exit 1 with every job done: the run's checklist failed (a device call keeps the fleet's figure).
        return _run(argv, dict(os.environ), REPO, accept=lambda code: code == 0 or (code == 1 and all_done(out)))
    finally:
        if copy is not None:
            copy.unlink(missing_ok=True)


def shrink(data: dict) -> None:
    """CPU rehearsal sizes of a bench fleet: a few steps of small images (the plumbing, not the figures)."""
    d = data.setdefault("defaults", {})
    d.setdefault("train", {}).update(max_steps=3, log_every=1, batch=4)
    d.setdefault("train", {}).pop("epochs", None)
    syn = d.setdefault("data", {}).get("synthetic")
    if syn:
        syn.update(train_size=48, val_size=4, image_size=96)
    d["data"]["workers"] = 0
    if d.get("model_args", {}).get("min_size"):
        d["model_args"].update(min_size=128, max_size=128)


def job_figures(run_dir: Path) -> dict[str, dict]:
    """Per job of a fleet run: GPU(s), seconds to the release of its GPUs, median samples/s, who shared its GPU,
    its GPU utilisation and peak memory (telemetry)."""
    from musubi.records.evidence import gpu_peak_gib, gpu_utilisation, median_rate
    from musubi.store.rundir import read_jsonl

    rec = json.loads((run_dir / "fleet.json").read_text())
    out = {}
    for name, st in (rec.get("jobs") or {}).items():
        util = gpu_utilisation(run_dir / name)
        train = [r for r in read_jsonl(run_dir / name / "metrics.jsonl") if r.get("kind") == "train"]
        rate = median_rate(train)
        held = (st.get("released") or st.get("ended") or 0) - (st.get("started") or 0)
        out[name] = {"gpus": st.get("gpus") or (st.get("history") or [{}])[-1].get("gpus"),
                     "seconds": round(held, 1), "samples_per_s": round(rate, 1) if rate else None,
                     "shared_with": st.get("shared_with") or [],
                     "gpu_util": round(max(util.values()), 3) if util else None,
                     "peak_gib": gpu_peak_gib(run_dir / name), "state": st.get("state")}
    return out


def case_share(fleet: Path, tmp: Path, device: str, slots: int | None, small: bool, svg: Path | None,
               devices: int) -> dict:
    """GPU sharing measured: the fleet with machine.share_gpus off, then auto (same store, so the second reads
    the first's utilisation and peak memory; main's warm-up ran first)."""
    spans = {}
    for arm in ("off", "auto"):
        spans[arm] = run_fleet(fleet, tmp / f"share-{arm}", device, slots, machine={"share_gpus": arm},
                               small=small)
        print(f"share_gpus {arm}: {spans[arm]:.1f} s", flush=True)
    jobs = {arm: job_figures(tmp / f"share-{arm}") for arm in spans}
    shared = {n: j["shared_with"] for n, j in jobs["auto"].items() if j["shared_with"]}
    rows = {}
    for n, alone in jobs["off"].items():
        with_ = jobs["auto"].get(n, {})
        rows[n] = {"alone": alone, "auto": with_,
                   "slowdown_measured": round(with_["seconds"] / alone["seconds"], 3)
                   if with_.get("shared_with") and alone["seconds"] else None}
        print(f"  {n}: alone {alone['seconds']} s (utilisation {alone['gpu_util']}, peak {alone['peak_gib']} GiB); "
              f"auto {with_.get('seconds')} s" + (f" sharing with {', '.join(with_['shared_with'])}"
                                                   if with_.get("shared_with") else " alone"), flush=True)
    plan = json.loads((tmp / "share-auto" / "fleet.json").read_text()).get("plan") or {}
    out = {"makespan_s": {k: round(v, 1) for k, v in spans.items()}, "gain": round(spans["off"] / spans["auto"], 3),
           "shared": shared, "jobs": rows, "plan_auto": {k: plan.get(k) for k in ("how", "makespan_s", "share",
                                                                                   "unshared_s")}}
    print(f"  sharing: {len(shared)} job(s) shared a GPU; makespan off {spans['off']:.1f} s, auto "
          f"{spans['auto']:.1f} s ({out['gain']:.2f}x)", flush=True)
    if svg is not None:
        bars = []
        for arm in spans:
            rec = json.loads((tmp / f"share-{arm}" / "fleet.json").read_text())
            bars.append((f"share_gpus: {arm}", [Bar(a.name, a.gpus, a.start, a.released) for a in attempts_of(rec)]))
        svg.write_text(svg_timeline(bars, list(range(devices))))
    return out


def case_pin(fleet: Path, tmp: Path, device: str, slots: int | None, small: bool, images: int) -> dict:
    """CPU pinning measured on JPEG-decoding jobs side by side: machine.pin_cpus true, then false."""
    from musubi.data.synthetic_files import SyntheticFiles, write_synthetic_coco

    jpegs = tmp / "jpegs"
    t0 = time.perf_counter()
    w, h = (320, 180) if small else (1920, 1080)
    images = 16 if small else images
    write_synthetic_coco(jpegs / "train", SyntheticFiles(images=images, width=w, height=h,
                                                          min_object=8, max_object=40))
    write_synthetic_coco(jpegs / "val", SyntheticFiles(images=4 if small else 16, width=w, height=h, seed=1,
                                                        min_object=8, max_object=40))
    print(f"wrote {images} JPEG frames {w}x{h} in {time.perf_counter() - t0:.1f} s", flush=True)
    spans, jobs = {}, {}
    for arm, pin in (("pinned", True), ("unpinned", False)):
        spans[arm] = run_fleet(fleet, tmp / f"pin-{arm}", device, slots, machine={"pin_cpus": pin},
                               subst={"$JPEGS": str(jpegs)}, small=small)
        jobs[arm] = job_figures(tmp / f"pin-{arm}")
        print(f"{arm}: {spans[arm]:.1f} s " + json.dumps({n: j["samples_per_s"] for n, j in jobs[arm].items()}),
              flush=True)
    rates = {arm: [j["samples_per_s"] for j in js.values() if j["samples_per_s"]] for arm, js in jobs.items()}
    out = {"makespan_s": {k: round(v, 1) for k, v in spans.items()}, "jobs": jobs, "cores": os.cpu_count(),
           "order": "pinned then unpinned (one run each)",
           "pinned_over_unpinned_rate": round(sum(rates["pinned"]) / sum(rates["unpinned"]), 3)
           if rates["pinned"] and rates["unpinned"] and len(rates["pinned"]) == len(rates["unpinned"]) else None}
    print(f"  pinning: summed samples/s pinned/unpinned = {out['pinned_over_unpinned_rate']}; makespan pinned "
          f"{spans['pinned']:.1f} s, unpinned {spans['unpinned']:.1f} s", flush=True)
    return out


def remember(job, out: Path, device: str, n: int, started: float, ended: float) -> None:
    """A job's measured run as history for the fleet's duration model (the store the fleet run will read); with
    --copies also as the history of each copy (the same work under another name: the same run alone)."""
    from musubi.store.rundir import env_record

    global MACHINE
    if MACHINE is None:
        MACHINE = machine_of(env_record())
    keys = set()  # an external command's copies are the same command: one history key, one record
    for same in [job, *COPIES.get(job.name, [])]:
        if (key := job_key(same, MACHINE, device)) not in keys:
            keys.add(key)
            record_run(db_path(out.parent / "fleet"), same, MACHINE, device, n, started, ended, alone_dir(job, out))


#: --copies: each job's name -> its copies in the fleet file the fleet mode runs.
COPIES: dict[str, list] = {}


def derived_fleet(fleet: Path, tag: str, data: dict) -> Path:
    """`data` written as a fleet file beside `fleet` (.STEM.TAG.yaml), so its relative commands resolve as in
    `fleet`; the caller removes it."""
    path = fleet.with_name(f".{fleet.stem}.{tag}.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def copy_name(name: str, c: int) -> str:
    """Copy `c` of the job `name` in a fleet of copies (--copies): the first keeps the name, then NAME-c2, ..."""
    return name if c == 1 else f"{name}-c{c}"


def original_name(name: str, known: Iterable[str]) -> str:
    """The job a fleet job's name stands for: itself when `known` holds it, else the job it is a copy of."""
    known = set(known)
    return name if name in known else re.sub(r"-c\d+$", "", name)


def with_copies(fleet: Path, copies: int) -> Path:
    """A fleet file beside `fleet` holding each of its jobs `copies` times (copy c of a job named `x` is `x-c{c}`
    from c = 2, and waits for copy c of the jobs it waits for): a fleet of more jobs than GPUs, as teams run
    them (RGB and thermal variants of each model), from the measured jobs of `fleet`. The copies are the same
    work, so their (a) and (b) are the originals' times (each measured once), and the originals' history is
    recorded for them too (remember)."""
    data = yaml.safe_load(fleet.read_text())
    jobs = data["jobs"]
    data["jobs"] = [{**j, "name": copy_name(j["name"], c),
                     **({"after": [copy_name(a, c) for a in j["after"]]} if j.get("after") else {})}
                    for c in range(1, copies + 1) for j in jobs]
    data["name"] = f"{data['name']}-x{copies}"
    path = derived_fleet(fleet, f"x{copies}", data)
    copied = {j.name: j for j in load_fleet(path).jobs}
    COPIES.clear()
    for j in jobs:
        COPIES[j["name"]] = [copied[copy_name(j["name"], c)] for c in range(2, copies + 1)]
    return path


def with_only(fleet: Path, names: list[str]) -> Path:
    """A fleet file beside `fleet` holding only the jobs `names` (in the file's order; a job's `after` keeps
    only the jobs kept): part of the bench fleet, for a call of a time-limited machine."""
    data = yaml.safe_load(fleet.read_text())
    known = [j["name"] for j in data["jobs"]]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"--only {','.join(unknown)}: no such job in {fleet} (its jobs: {', '.join(known)})")
    kept = [j for j in data["jobs"] if j["name"] in names]
    for j in kept:
        if j.get("after"):
            j["after"] = [a for a in j["after"] if a in names]
            if not j["after"]:
                del j["after"]
    data["jobs"] = kept
    return derived_fleet(fleet, "only", data)


def alone_dir(job, out: Path) -> Path:
    """The job folder of a job run alone into `out` (`musubi train --out OUT/NAME` makes OUT/NAME/NAME)."""
    return out / job.name / job.name if isinstance(job, TaskJob) else out / job.name


MACHINE: list | None = None


def run_job_alone(job, base: Path, out: Path, device: str, n: int, gpu: str | None,
                  cpus: str | None = None) -> float:
    """Seconds of one job run alone on `n` GPUs (`gpu`: the one GPU index for single-GPU runs; `cpus`: the
    cores it gets when others run beside it); recorded as history of the job for the fleet's duration model."""
    started = time.time()
    job_dir = alone_dir(job, out)
    seconds = _run_alone(job, base, out, device, n, gpu, cpus)
    remember(job, out, device, n, started, started + seconds)
    # The origin the fleet marks when it spawns a job ("spawned"; not written here: the run folder must not
    # exist before `musubi train` makes it).
    comp = components({**marks_of(job_dir), "spawned": started}) if isinstance(job, TaskJob) else {}
    if comp:  # the same breakdown as the fleet's jobs: what a job pays alone against in the fleet
        STARTUP_ALONE.setdefault(out.name, {})[job.name] = comp
        print(f"  start-up of {job.name} alone on {n} GPU(s): {summary_line(comp)}", flush=True)
    return seconds


#: Start-up components of the jobs run alone, by mode folder ("a", "b") and job.
STARTUP_ALONE: dict[str, dict[str, dict[str, float]]] = {}


def _run_alone(job, base: Path, out: Path, device: str, n: int, gpu: str | None, cpus: str | None = None) -> float:
    env = dict(os.environ)
    if gpu is not None:  # what the fleet gives a job on this GPU: the device, its cores and as many threads
        env.update(gpu_env([int(gpu)], device, cpus=cpus))
    if isinstance(job, TaskJob):
        path = out / f"{job.name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(job.spec.resolved()))
        argv = [sys.executable, "-m", "musubi.cli", "train", str(path), "--nproc", str(n), "--out",
                str(out / job.name), "--device", device, "--no-check"]
        return _run(argv, env, REPO)
    assert isinstance(job, CommandJob)
    job_dir = out / job.name
    job_dir.mkdir(parents=True, exist_ok=True)
    env.update(job.env, MUSUBI_JOB_DIR=str(job_dir))
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = gpu or "0"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return _run(resolve_command(job, base), env, job_dir, union_cpus(cpus),
                watch=(job_dir, [int(gpu or 0)]) if device == "cuda" else None)


def run_sequential(fleet: Path, out: Path, device: str, gpus_all: int, all_gpus: bool,
                   durations: dict[str, float], single_known: dict[str, float] | None = None,
                   saved=lambda: None) -> float:
    """Each job alone, one after another: on one GPU (a), or on all GPUs for distributable jobs (b).

    `single_known`: (a)'s times, reused in (b) for the single-GPU-only jobs, which (b) runs exactly
    as (a) does (alone on one GPU): measuring them twice would only spend device time."""
    spec = load_fleet(fleet)
    base = fleet.resolve().parent
    for job in spec.jobs:
        if job.name in durations:  # measured by an earlier call (--work)
            continue
        n = gpus_all if (all_gpus and isinstance(job, TaskJob)) else 1
        if n == 1 and all_gpus and single_known and job.name in single_known:
            durations[job.name] = single_known[job.name]
            continue
        durations[job.name] = run_job_alone(job, base, out, device, n, None)
        saved()
    return sum(durations.values())


def run_solo_parallel(fleet: Path, out: Path, device: str, slots: int, durations: dict[str, float],
                      saved=lambda: None) -> float:
    """(a) measured `slots` jobs at a time, each alone on its own GPU; the makespan of (a) is the SUM of
    the jobs' times (what running them one after another on one GPU takes). Saves device time; the
    jobs share the host, so if anything this makes (a) slower, never faster. Each job gets its GPU's cores
    from the fleet's own core plan (fleet/machine.py device_cores), pinned, with as many threads, as in the
    fleet: unpinned, two external detectors at once with 64 threads each took 273 s on 4x H200 against 71 s
    each in the fleet (2026-11-27)."""
    spec = load_fleet(fleet)
    base = fleet.resolve().parent
    free: queue.Queue[str] = queue.Queue()
    for i in range(slots):
        free.put(str(i))
    cores = device_cores(list(range(slots)), read_node_topology() if device == "cuda" else None)

    def one(job) -> tuple[str, float]:
        gpu = free.get()
        try:
            return job.name, run_job_alone(job, base, out, device, 1, gpu, cpus_value(cores, [int(gpu)]))
        finally:
            free.put(gpu)

    with ThreadPoolExecutor(max_workers=slots) as pool:
        for name, seconds in pool.map(one, [j for j in spec.jobs if j.name not in durations]):
            durations[name] = seconds
            saved()
    return sum(durations.values())


def compare(run_dir: Path, devices: int, svg: Path | None) -> dict:
    """Predicted (the fleet's first plan) against measured (fleet.json) per job and for the makespan."""
    rec = json.loads((run_dir / "fleet.json").read_text())
    plan, jobs = rec.get("plan") or {}, rec.get("jobs") or {}
    attempts = attempts_of(rec)
    # One bar per attempt, to the release of its GPUs (its evaluation after that is the pale tail).
    measured = [Bar(a.name, a.gpus, a.start, a.released) for a in attempts]
    tails = {a.name: a.end for a in attempts}
    predicted = [Bar(b["job"], tuple(range(b["width"])), b["start"], b["end"]) for b in plan.get("bars", [])]
    rows = {}
    for n, s in jobs.items():
        took = (s["ended"] - s["started"]) if s.get("started") and s.get("ended") else None
        rows[n] = {"width": s.get("width"), "predicted_s": s.get("predicted_s"), "measured_s": round(took, 1)
                   if took else None, "source": s.get("estimate"),
                   "error": round(s["predicted_s"] / took - 1, 3) if took and s.get("predicted_s") else None}
        print(f"  {n}: {s.get('width')} GPU(s), predicted {s.get('predicted_s') or 0:.0f} s "
              f"({s.get('estimate')}), measured {took or 0:.0f} s", flush=True)
    span = max((a.end for a in attempts), default=0.0)
    startup = {n: s.get("startup") or {} for n, s in jobs.items()}
    for n, comp in startup.items():
        print(f"  start-up of {n}: {summary_line(comp)}", flush=True)
    firsts = [c["to first step"] for c in startup.values() if "to first step" in c]
    on_gpu = [c["start-up on the GPUs"] for c in startup.values() if "start-up on the GPUs" in c]
    sim = replay(rec)
    out = {"plan": plan.get("how"), "predicted_makespan_s": plan.get("makespan_s"),
           "declared_makespan_s": plan.get("declared_s"), "measured_jobs_makespan_s": round(span, 1), "jobs": rows,
           "startup": startup, "replayed_makespan_s": round(sim.simulated_s, 1),
           "mean_to_first_step_s": round(sum(firsts) / len(firsts), 2) if firsts else None,
           "mean_startup_on_gpus_s": round(sum(on_gpu) / len(on_gpu), 2) if on_gpu else None}
    print(f"  start-up per job: {out['mean_to_first_step_s']} s to the first step, {out['mean_startup_on_gpus_s']} s "
          f"of it on the GPUs; replayed by the packer: {sim.simulated_s:.1f} s ({sim.error:+.1%})", flush=True)
    print(f"  makespan of the jobs: predicted {plan.get('makespan_s')} s ({plan.get('how')}; declared widths "
          f"{plan.get('declared_s')} s), measured {span:.1f} s", flush=True)
    for line in text_timeline(measured, list(range(devices))):
        print("  " + line, flush=True)
    if svg is not None:
        svg.write_text(svg_timeline([("predicted (first plan)", predicted), ("measured", measured)],
                                    list(range(devices)), tails=tails))
    return out


def against_alone(rec: dict, alone: dict[str, float]) -> dict:
    """Where each fleet job's time went, against its run alone (`alone`: (a)'s seconds by job; a copy NAME-cK
    is NAME's work). Its last attempt's parts: `waited`, from the GPU's assignment to the spawn (an external
    command waits there for the evaluation step of the job before it on its GPU; a task job is spawned at
    once and its start-up overlaps that step); `ran`, the process from spawn to exit (start-up, training and
    teardown: what (a) times); `evaluation`, the fleet's evaluation step after it, which (a) does not run
    (with machine.overlap off, CPU slots' default, the GPUs go back after that step: `ran` holds it too).
    `ran_vs_alone` above 1: the job itself ran slower in the fleet than alone (4x H200, 2026-11-27: the
    launch-bound jobs ran slower, fcos 1.09-1.12x and the external detectors 1.13-1.26x, the GPU-bound ones
    0.99-1.01x). Only a run on one GPU compares with (a): a moldable job the fleet widened has no `alone_s`."""
    rows: dict[str, dict] = {}
    for name, st in (rec.get("jobs") or {}).items():
        att = (st.get("history") or [{}])[-1]
        started, ended = att.get("started"), att.get("ended")
        spawned = att["spawned"] if att.get("spawned") is not None else started
        released = att["released"] if att.get("released") is not None else ended
        if started is None or ended is None:  # never started, or did not end
            continue
        width = len(att.get("gpus") or st.get("gpus") or [0])
        alone_s = alone.get(original_name(name, alone)) if width == 1 else None
        ran = released - spawned
        rows[name] = {"width": width, "waited_s": round(spawned - started, 1), "ran_s": round(ran, 1),
                      "evaluation_s": round(ended - released, 1), "alone_s": alone_s,
                      "ran_vs_alone": round(ran / alone_s, 3) if alone_s else None}
        r = rows[name]
        vs = f"alone {r['alone_s']:.1f} s: {r['ran_vs_alone']}x" if r["alone_s"] else f"on {width} GPU(s), not (a)'s one"
        print(f"  {name}: waited {r['waited_s']} s, ran {r['ran_s']} s ({vs}), evaluation {r['evaluation_s']} s",
              flush=True)
    known = [r for r in rows.values() if r["alone_s"]]
    extra = {"waited_s": round(sum(r["waited_s"] for r in known), 1),
             "ran_beyond_alone_s": round(sum(r["ran_s"] - r["alone_s"] for r in known), 1),
             "evaluation_s": round(sum(r["evaluation_s"] for r in known), 1)}
    # An external command's wait is mostly the evaluation step before it on its GPU: the two overlap.
    print(f"  the fleet's jobs against their runs alone: {extra['ran_beyond_alone_s']} GPU-s longer processes, "
          f"{extra['evaluation_s']} GPU-s of evaluation steps; external commands waited {extra['waited_s']} s in "
          f"all to spawn (behind the evaluation step before them on their GPU)", flush=True)
    return {"jobs": rows, "sums": extra}


def fleet_overhead(run_dir: Path, started: float, ended: float) -> dict:
    """The fleet's time outside its jobs: from `musubi run`'s start (`started`, this script's wall clock) to
    the first job's spawn, and from the last job's end to the exit (`ended`), of which shipping (ship_s)."""
    rec = json.loads((run_dir / "fleet.json").read_text())
    attempts = [h for s in (rec.get("jobs") or {}).values() for h in s.get("history") or []]
    spawns = [h.get("spawned") or h.get("started") for h in attempts if h.get("spawned") or h.get("started")]
    ends = [h["ended"] for h in attempts if h.get("ended")]
    out = {"to_first_spawn_s": round(min(spawns) - started, 2) if spawns else None,
           "after_last_end_s": round(ended - max(ends), 2) if ends else None, "ship_s": rec.get("ship_s"),
           "early_export_asked": sorted(n for n, s in (rec.get("jobs") or {}).items() if s.get("early_export")),
           "exported_early": rec.get("exported_early", []), "startup": rec.get("startup") or {}}
    if out["startup"]:
        print("  fleet start-up before its first job: " + ", ".join(f"{k} {v:.2f} s" for k, v in
                                                                    out["startup"].items()), flush=True)
    if ends and isinstance(rec.get("checked_at"), (int, float)):  # the rest: the process's exit
        out["checklist_s"], out["exit_s"] = rec.get("checklist_s"), round(ended - rec["checked_at"], 2)
    print(f"  fleet overhead: {out['to_first_spawn_s']} s to the first spawn, {out['after_last_end_s']} s after "
          f"the last job (shipping {out['ship_s']} s, checklist {out.get('checklist_s')} s, exit after it "
          f"{out.get('exit_s')} s; early export asked of: "
          f"{', '.join(out['early_export_asked']) or 'none'}; shipped from it: "
          f"{', '.join(out['exported_early']) or 'none'})", flush=True)
    return out


#: Each finished mode's makespan and job seconds in a --work folder (what later calls add to).
MODES_FILE = "modes.json"


def read_modes(work: Path) -> dict:
    """Figures of the modes earlier calls measured in `work` ({} when none)."""
    try:
        return json.loads((work / MODES_FILE).read_text())
    except (OSError, ValueError):
        return {}


def write_modes(work: Path, figures: dict) -> None:
    """Save the measured modes at once (a call cut off by its time limit keeps what it finished); modes
    without a measured job are left out."""
    tmp = work / f".{MODES_FILE}.tmp"
    tmp.write_text(json.dumps({**figures, "job_s": {m: d for m, d in figures["job_s"].items() if d}}, indent=1))
    tmp.replace(work / MODES_FILE)


def main() -> None:
    """Run the selected modes and print the comparison."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleet", type=Path, default=REPO / "bench" / "fleet-bench.yaml")
    ap.add_argument("--modes", default="a,b,fleet",
                    help="a and b first: their measured jobs are the fleet's duration history; fleet-no-overlap: "
                    "the fleet with machine.overlap false (the start-up cuts off), for their before/after; "
                    "fleet-unshared: the fleet with machine.share_gpus off, for what sharing gained")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cpu-slots", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--svg", type=Path, default=None, help="draw the predicted and measured fleet timelines")
    ap.add_argument("--share-fleet", type=Path, default=REPO / "bench" / "fleet-share-2gpu.yaml")
    ap.add_argument("--pin-fleet", type=Path, default=REPO / "bench" / "fleet-pin-2gpu.yaml")
    ap.add_argument("--pin-images", type=int, default=1024, help="JPEG train frames (1920x1080) the pin case writes")
    ap.add_argument("--small", action="store_true", help="share/pin cases at CPU rehearsal sizes")
    ap.add_argument("--a-parallel", action="store_true",
                    help="measure (a) as jobs alone on separate GPUs at once; (a) = the sum of their times")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="skip the untimed warm-up (imports, and a GPU load on every GPU) before the first mode")
    ap.add_argument("--copies", type=int, default=1,
                    help="the fleet modes run each job this many times (as NAME-cK): (a) and (b) measure each job "
                    "once and count it that many times")
    ap.add_argument("--only", default=None, help="run only these jobs of the fleet file (comma-separated names)")
    ap.add_argument("--work", type=Path, default=None,
                    help="keep the runs and the store in WORK (not a new temporary folder) and each finished mode's "
                    "figures in WORK/modes.json: modes measured by earlier calls on this machine count, so a, fleet "
                    "and b can be measured in separate calls of a time-limited GPU machine")
    args = ap.parse_args()
    if args.copies < 1:
        raise SystemExit(f"--copies {args.copies}: give 1 or more")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    given = args.fleet
    if args.only:
        args.fleet = with_only(args.fleet, [n.strip() for n in args.only.split(",") if n.strip()])
    # The fleet modes' file: the jobs `copies` times ((a) and (b) run the file's jobs once each).
    fleet_file = with_copies(args.fleet, args.copies) if args.copies > 1 else args.fleet
    if args.device == "cuda":
        import torch

        n = torch.cuda.device_count()
    else:
        n = args.cpu_slots or 2
    # Absolute: an external job runs in its own folder with MUSUBI_JOB_DIR set from this path.
    tmp = (args.work or Path(tempfile.mkdtemp(prefix="fleet-bench-"))).resolve()
    tmp.mkdir(parents=True, exist_ok=True)
    if not args.no_warm_up:
        warm_up(args.device, n)
    # What is measured, as saved in WORK/modes.json after every job: earlier calls' figures count (--work).
    figures = {"makespan_s": {}, "job_s": {}, "a_measured": None, "wall": {}, **read_modes(tmp)}
    result: dict[str, float] = figures["makespan_s"]
    jobs: dict[str, dict[str, float]] = figures["job_s"]
    report_extra: dict[str, dict] = {}
    if result:
        print(f"earlier calls measured (from {tmp / MODES_FILE}): {json.dumps(result)}", flush=True)

    def saved() -> None:
        write_modes(tmp, figures)

    for mode in args.modes.split(","):
        if mode.startswith("fleet") and mode in result:  # an earlier call ran it (--work): compared, not re-run
            print(f"{mode}: {result[mode]:.1f} s (measured by an earlier call)", flush=True)
            continue
        jobs.setdefault(mode, {})  # the jobs an earlier call measured (--work) are not run again
        if mode in ("a", "a-again"):
            figures["a_measured"] = "in parallel, one job per GPU, summed" if args.a_parallel else "sequential"
        if mode == "share":
            report_extra["share"] = case_share(args.share_fleet, tmp, args.device, args.cpu_slots, args.small,
                                               args.svg, n)
            continue
        if mode == "pin":
            report_extra["pin"] = case_pin(args.pin_fleet, tmp, args.device, args.cpu_slots, args.small,
                                           args.pin_images)
            continue
        if mode in ("fleet", "fleet-no-overlap", "fleet-unshared"):
            t0 = time.time()  # the clock of fleet.json's times: the fleet's overhead outside its jobs
            # fleet-unshared: the same fleet with machine.share_gpus off, for what sharing gained
            result[mode] = run_fleet(fleet_file, tmp / mode, args.device, args.cpu_slots, mode != "fleet-no-overlap",
                                     machine={"share_gpus": "off"} if mode == "fleet-unshared" else None)
            figures.setdefault("wall", {})[mode] = [t0, time.time()]
        elif mode in ("a", "a-again") and args.a_parallel:
            result[mode] = run_solo_parallel(args.fleet, tmp / mode, args.device, n, jobs[mode], saved)
        elif mode in ("a", "a-again"):
            result[mode] = run_sequential(args.fleet, tmp / mode, args.device, n, False, jobs[mode], saved=saved)
        elif mode == "b":
            result[mode] = run_sequential(args.fleet, tmp / "b", args.device, n, True, jobs[mode], jobs.get("a"),
                                          saved)
        print(f"{mode}: {result[mode]:.1f} s {json.dumps({k: round(v, 1) for k, v in jobs[mode].items()})}",
              flush=True)
        saved()
    report = {"devices": n, "device": args.device, "makespan_s": {k: round(v, 1) for k, v in result.items()},
              "job_s": {m: {k: round(v, 1) for k, v in d.items()} for m, d in jobs.items() if d},
              "a_measured": figures["a_measured"], "startup_alone": STARTUP_ALONE, **report_extra}
    if "fleet-no-overlap" in result:
        print("fleet-no-overlap (machine.overlap: false):", flush=True)
        report["no_overlap"] = compare(tmp / "fleet-no-overlap", n, None)
    if "fleet-unshared" in result:
        print("fleet-unshared (machine.share_gpus: off):", flush=True)
        report["unshared"] = compare(tmp / "fleet-unshared", n, None)
        if "fleet-unshared" in figures.get("wall", {}):
            report["unshared"]["fleet_overhead"] = fleet_overhead(tmp / "fleet-unshared",
                                                                  *figures["wall"]["fleet-unshared"])
    if "fleet" in result:
        print("fleet:", flush=True)
        report["prediction"] = compare(tmp / "fleet", n, args.svg)
        rec = json.loads((tmp / "fleet" / "fleet.json").read_text())
        if jobs.get("a"):  # each job in the fleet against its run alone: slower, evaluation, waiting
            report["against_alone"] = against_alone(rec, jobs["a"])
        if jobs.get("a-again"):
            print("fleet against the second (a):", flush=True)
            report["against_alone_again"] = against_alone(rec, jobs["a-again"])
        if "fleet" in figures.get("wall", {}):
            report["fleet_overhead"] = fleet_overhead(tmp / "fleet", *figures["wall"]["fleet"])
    if jobs.get("a") and jobs.get("a-again"):  # the machine's drift between the two runs alone of each job
        report["a_again_over_a"] = {k: round(v / jobs["a"][k], 3) for k, v in jobs["a-again"].items()
                                    if jobs["a"].get(k)}
        print(f"(a) again over (a): {json.dumps(report['a_again_over_a'])}", flush=True)
    if "fleet" in result and "fleet-unshared" in result:
        report["sharing_gain"] = round(result["fleet-unshared"] / result["fleet"], 3)
    # (a) and (b) of a fleet of copies: each measured job counted once per copy (the same work).
    k = args.copies
    if k > 1:
        report["copies"] = k
        report["makespan_s_of_copies"] = {m: round(k * result[m], 1) for m in ("a", "b") if m in result}
    if "fleet" in result and "a" in result:
        report["speedup_vs_a"] = round(k * result["a"] / result["fleet"], 2)
        report["target_vs_a"] = round(0.9 * n, 2)
    if "fleet" in result and "b" in result:
        report["speedup_vs_b"] = round(k * result["b"] / result["fleet"], 2)
    if fleet_file != args.fleet:
        fleet_file.unlink(missing_ok=True)
    if args.fleet != given:
        args.fleet.unlink(missing_ok=True)
    print(json.dumps(report), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
