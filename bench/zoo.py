"""The model zoo in one fleet on one machine: RGB + thermal, CNN + transformer, three model families.

    python bench/zoo.py OUT [--fleet examples/fleet-zoo-4gpu.yaml] [--budget-s 210] [--work DIR]
                            [--no-check] [--small] [--device cuda|cpu] [--cpu-slots N]

Writes the fleet's thermal set (16-bit radiometric PNG, the sizes the fleet file's header names), runs
`musubi run` on the fleet from a work folder (default: a fresh folder under /tmp; the run is WORK/run),
and puts two files into OUT, which it creates (a device call returns only a few files):

- `zoo-leaderboard.json`: RUN/leaderboard.json (the fleet's ranking: mAP50, FPS, score per job) with this
  bench's summary under "zoo": seconds of each phase, each job's state, GPU, seconds, mAP50, FPS, whether it
  learned (the checklist's `learned` item PASS: judged by mAP50, musubi/records/learning.py; the loss is
  reported beside it, not judged: a two-stage detector's loss climbs as it gets better), the checklist's counts;
- `zoo-run.tgz`: the run's small files (fleet.json, fleet.log, checklist.json, leaderboard.json, run.json,
  env.json, each job's job/summary/eval/metrics/goodput/startup files, telemetry) with the console of
  `musubi run`, the printed leaderboard (leaderboard.txt) and the summary (zoo.json); no checkpoint, weights
  or ONNX file, and no file over --file-cap-mib (their names and sizes go in skipped.txt inside).

The fleet gets `--budget-s` seconds from the start of this command (the thermal set included): past it,
`musubi run` is sent SIGTERM (it stops its jobs and records them interrupted), the leaderboard and the
checklist are built from what finished, and the archive is written anyway; the command ends within ~40 s of
the budget. Exit 0 when every job finished and learned, 1 otherwise (the files are written either way).

On 4 GPUs (H100/H200) the default fleet runs its four single-GPU jobs at once; the slowest, D-FINE, took
120 s on one H200 in a 2-GPU run (2026-11-26, start-up and evaluation included). `--small`: CPU rehearsal
sizes (a 16-frame thermal set of 64 px, 3 steps, the tiny model configs of the tests): the plumbing only,
not the figures, and not whether the full-size models learn.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.provenance import commit  # noqa: E402
from musubi.contract.run_files import RUN_FILES  # noqa: E402
from musubi.data.synthetic_files import SyntheticFiles, write_synthetic_coco  # noqa: E402

#: The thermal set the zoo fleets read (as their header's `musubi data synth` lines write it), by folder.
THERMAL = {
    "zoo-thermal/train": SyntheticFiles(images=1600, width=160, height=160, objects=3, min_object=16, max_object=48,
                                        seed=0, thermal=True),
    "zoo-thermal/val": SyntheticFiles(images=64, width=160, height=160, objects=3, min_object=16, max_object=48,
                                      seed=1, thermal=True),
}
#: Files never archived: weights, checkpoints and exported graphs (megabytes to gigabytes, and not results).
HEAVY_SUFFIXES = (".pt", ".pth", ".onnx", ".distcp", ".safetensors", ".bin", ".ckpt", ".npz")
HEAVY_DIRS = ("checkpoints", "ckpt")
#: The device call returns files of at most 16 MiB: the archive stays under this.
ARCHIVE_LIMIT = 15 * 2**20
#: After SIGTERM at the budget, the seconds `musubi run` gets to stop its jobs before SIGKILL.
STOP_GRACE_S = 30


def small_thermal(p: SyntheticFiles) -> SyntheticFiles:
    """CPU rehearsal size of a thermal split: a few 64-px frames."""
    return replace(p, images=16 if p.seed == 0 else 4, width=64, height=64, objects=2, min_object=8, max_object=24)


def small_model_args(model: str) -> dict[str, Any]:
    """The tests' tiny configs of each family (seconds a step on a CPU), or {} for torchvision's models."""
    from tests.tasks.detr_tiny import TINY_DFINE, TINY_RTDETR

    if model.startswith("rtdetr"):
        return dict(TINY_RTDETR)
    if model.startswith("dfine"):
        return dict(TINY_DFINE)
    if model.startswith("efficientdet"):  # timm's smallest MobileNetV3 behind a one-cell BiFPN, strides 8-32
        return {"backbone_name": "mobilenetv3_small_050", "max_level": 5, "fpn_channels": 16,
                "fpn_cell_repeats": 1, "box_class_repeats": 1, "image_size": 64, "bn_momentum": 0.1}
    return {}


def shrink(fleet: dict[str, Any]) -> None:
    """CPU rehearsal sizes of the zoo fleet, in place: 3 steps of 2 images of 64 px, tiny models."""
    train = fleet.setdefault("defaults", {}).setdefault("train", {})
    train.pop("epochs", None)
    train.update(max_steps=3, batch=2, log_every=1, warmup_steps=1, eval_every=3)
    for job in fleet["jobs"]:
        data = dict(job.get("data") or {})  # a copy: YAML anchors share one dict between jobs
        data["workers"] = 0
        if data.get("synthetic"):
            data["synthetic"] = {**data["synthetic"], "train_size": 8, "val_size": 4, "image_size": 64,
                                 "min_object": 8, "max_object": 24}
        if data.get("image_size"):
            data["image_size"] = 64
        job["data"] = data
        args = dict(job.get("model_args") or {})
        if "min_size" in args:
            args.update(min_size=64, max_size=64)
        args.update(small_model_args(str(job.get("model", ""))))
        job["model_args"] = args


def write_thermal(work: Path, small: bool) -> float:
    """The thermal set under WORK (where `musubi run` starts); seconds taken."""
    t0 = time.perf_counter()
    for folder, p in THERMAL.items():
        write_synthetic_coco(work / folder, small_thermal(p) if small else p)
    return time.perf_counter() - t0


def run_fleet(fleet: Path, work: Path, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """`musubi run` to its end or to the deadline (then SIGTERM, then SIGKILL); its exit code and console."""
    argv = [sys.executable, "-m", "musubi.cli", "run", str(fleet), "--out", str(work / "run"), "--device",
            args.device]
    if args.cpu_slots:
        argv += ["--cpu-slots", str(args.cpu_slots)]
    if args.no_check:
        argv.append("--no-check")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    console = work / "console.txt"
    t0 = time.perf_counter()
    with console.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
        stopped = False
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stopped = True
            print(f"zoo: budget reached after {time.perf_counter() - t0:.0f} s of fleet: stopping it (SIGTERM)",
                  flush=True)
            proc.send_signal(signal.SIGTERM)  # musubi run stops its jobs and records them interrupted
            try:
                code = proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
    return {"argv": argv[1:], "exit_code": code, "stopped_at_budget": stopped,
            "seconds": round(time.perf_counter() - t0, 1)}


def leaderboard(run_dir: Path, fleet_file: Path) -> tuple[dict[str, Any], str]:
    """RUN/leaderboard.json (built from the finished jobs, by the fleet's own rule with the config's defaults,
    when the fleet did not get to it) and its table."""
    from rich.console import Console

    from musubi.config.load import load_fleet
    from musubi.evaluate.leaderboard import build_leaderboard, read_leaderboard
    from musubi.evaluate.leaderboard_view import leaderboard_table

    if not (run_dir / RUN_FILES.leaderboard).is_file():
        lb = load_fleet(fleet_file).leaderboard
        build_leaderboard(run_dir, weights=(lb.quality_weight, lb.fps_weight), fps_target=lb.fps_target,
                          quality_floor=lb.quality_floor, history=False)
    board = read_leaderboard(run_dir)
    text = io.StringIO()
    Console(file=text, width=160).print(leaderboard_table(board))
    return board, text.getvalue()


def checklist(run_dir: Path) -> dict[str, Any]:
    """RUN/checklist.json (built when `musubi run` was stopped before writing it)."""
    from musubi.records.checklist import build_checklist, write_checklist

    path = run_dir / RUN_FILES.checklist
    if not path.is_file():
        write_checklist(run_dir, build_checklist(run_dir))
    return json.loads(path.read_text(encoding="utf-8"))


def job_rows(run_dir: Path, board: dict[str, Any], cl: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per job: state, GPUs, seconds held, mAP50, FPS, rank, the checklist's loss finding, learned or not (its
    `learned` item)."""
    from musubi.records.evidence import eval_metrics

    fleet = json.loads((run_dir / RUN_FILES.fleet).read_text(encoding="utf-8"))
    ranked = {r.get("job"): r for r in board.get("rows", [])}
    loss = {i["job"]: i for i in cl.get("items", []) if i.get("check") == "loss"}
    learned = {i["job"]: i for i in cl.get("items", []) if i.get("check") == "learned"}
    rows = {}
    for name, st in (fleet.get("jobs") or {}).items():
        metrics = eval_metrics(run_dir / name)
        map50 = metrics.get("map50")
        start, end = st.get("started"), st.get("released") or st.get("ended")
        item = loss.get(name, {})
        rows[name] = {
            "state": st.get("state"), "gpus": st.get("gpus") or (st.get("history") or [{}])[-1].get("gpus"),
            "seconds": round(end - start, 1) if start and end else None, "map50": map50,
            "map": metrics.get("map"), "fps": ranked.get(name, {}).get("fps"), "rank": ranked.get(name, {}).get("rank"),
            "score": ranked.get(name, {}).get("score"), "loss": item.get("found"),
            "learned": learned.get(name, {}).get("status") == "PASS", "learned_why": learned.get(name, {}).get("found"),
        }
    return rows


def archive(work: Path, tgz: Path, cap: int) -> list[str]:
    """WORK/run's small files, console.txt, leaderboard.txt and zoo.json into TGZ; returns what was skipped."""
    run_dir = work / "run"
    keep, skipped = [], []
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(work)
        size = path.stat().st_size
        if path.suffix in HEAVY_SUFFIXES or any(part in HEAVY_DIRS for part in rel.parts) or size > cap:
            skipped.append(f"{rel} {size}")
        else:
            keep.append((path, rel, size))
    # Largest first out until the archive fits what comes back from the device (compression ignored: safe).
    keep.sort(key=lambda k: k[2])
    while keep and sum(k[2] for k in keep) > ARCHIVE_LIMIT:
        path, rel, size = keep.pop()
        skipped.append(f"{rel} {size} (archive limit)")
    (work / "skipped.txt").write_text("\n".join(skipped) + "\n", encoding="utf-8")
    with tarfile.open(tgz, "w:gz") as tar:
        for name in ("zoo.json", "leaderboard.txt", "console.txt", "skipped.txt"):
            if (work / name).is_file():
                tar.add(work / name, arcname=f"zoo/{name}")
        for path, rel, _ in sorted(keep, key=lambda k: str(k[1])):
            tar.add(path, arcname=f"zoo/{rel}")
    return skipped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder for zoo-leaderboard.json and zoo-run.tgz (created)")
    ap.add_argument("--fleet", type=Path, default=REPO / "examples" / "fleet-zoo-4gpu.yaml")
    ap.add_argument("--budget-s", type=float, default=210.0,
                    help="seconds from the start after which the fleet is stopped (default 210)")
    ap.add_argument("--work", type=Path, help="work folder (default: a fresh one under the temp folder)")
    ap.add_argument("--no-check", action="store_true", help="skip the fleet's preflight (~10 s on 4 GPUs)")
    ap.add_argument("--small", action="store_true", help="CPU rehearsal sizes (plumbing, not figures)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--cpu-slots", type=int, help="with --device cpu: CPU rank slots")
    ap.add_argument("--file-cap-mib", type=float, default=4.0, help="larger run files stay out of the archive")
    args = ap.parse_args()
    started = time.monotonic()
    deadline = started + args.budget_s
    if not args.fleet.is_file():
        print(f"error: fleet file {args.fleet} not found; give --fleet a fleet YAML", file=sys.stderr)
        return 2
    if args.work is not None and args.work.exists() and any(args.work.iterdir()):
        print(f"error: --work {args.work} is not empty; give a new folder (earlier results are kept)",
              file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="musubi-zoo-"))
    work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)

    fleet = yaml.safe_load(args.fleet.read_text(encoding="utf-8"))
    if args.small:
        shrink(fleet)
    fleet_copy = work / "fleet.yaml"
    fleet_copy.write_text(yaml.safe_dump(fleet, sort_keys=False), encoding="utf-8")
    synth_s = write_thermal(work, args.small)
    print(f"zoo: thermal set written in {synth_s:.1f} s under {work}", flush=True)
    run = run_fleet(fleet_copy, work, args, deadline)
    print(f"zoo: musubi run exited {run['exit_code']} after {run['seconds']} s", flush=True)

    run_dir = work / "run"
    summary: dict[str, Any] = {"fleet": str(args.fleet.relative_to(REPO) if args.fleet.is_relative_to(REPO)
                                            else args.fleet), "small": args.small, "git": commit(),
                               "budget_s": args.budget_s, "work": str(work), "run": run,
                               "seconds": {"thermal_set": round(synth_s, 1), "fleet": run["seconds"]}}
    table, board = "", {}
    if (run_dir / RUN_FILES.fleet).is_file():
        board, table = leaderboard(run_dir, fleet_copy)
        cl = checklist(run_dir)
        jobs = job_rows(run_dir, board, cl)
        summary.update(jobs=jobs, checklist=cl.get("counts"), checklist_ok=cl.get("ok"),
                       all_learned=bool(jobs) and all(j["state"] == "done" and j["learned"] for j in jobs.values()))
    else:
        summary.update(jobs={}, all_learned=False, error="musubi run wrote no fleet.json: see console.txt")
    summary["seconds"]["total"] = round(time.monotonic() - started, 1)
    (work / "leaderboard.txt").write_text(table, encoding="utf-8")
    (work / "zoo.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    skipped = archive(work, args.out / "zoo-run.tgz", int(args.file_cap_mib * 2**20))
    summary["archive_skipped"] = len(skipped)
    (args.out / "zoo-leaderboard.json").write_text(json.dumps({**board, "zoo": summary}, indent=1), encoding="utf-8")

    print(table, end="")
    where = "GPU" if args.device == "cuda" else "CPU slot"
    for name, j in summary["jobs"].items():
        print(f"zoo: {name}: {j['state']} on {where} {j['gpus']}, {j['seconds']} s, mAP50 {j['map50']}, "
              f"fps {j['fps']}, loss {j['loss']} -> {'learned' if j['learned'] else 'DID NOT LEARN'} "
              f"({j['learned_why']})")
    if summary.get("error"):
        print(f"zoo: {summary['error']}")
        print((work / "console.txt").read_text(encoding="utf-8", errors="replace")[-3000:])
    print(f"zoo: checklist {summary.get('checklist')}; all learned: {summary['all_learned']}; "
          f"{summary['seconds']['total']} s in all; {len(skipped)} file(s) left out of {args.out / 'zoo-run.tgz'}")
    return 0 if summary["all_learned"] else 1


if __name__ == "__main__":
    sys.exit(main())
