"""Quality parity (issue 43): Musubi trains a model as well as a plain PyTorch loop does.

The same model, data, seed, schedule and number of samples, trained three ways, over >= 3 seeds each:
- the plain loop: bench/plain_quality_loop.py, one process, one GPU (no Musubi import; torchvision
  references' style);
- `musubi train` on 1 GPU, and with DDP on N GPUs (default 4; on CPU: 1 and 2 gloo ranks).
Models: (a) a classifier, torchvision resnet18 at 32 px; (b) a CNN detector, torchvision Faster R-CNN
MobileNetV3-Large FPN (the 320 variant's builder) at its 320 px; (c) a DETR-family detector, transformers'
RT-DETR with ResNet-18 (Musubi's `rtdetr_r18` preset; the plain loop builds the same config from
transformers directly) at the scenes' 256 px; `--models dfine` adds (or runs alone) transformers' D-FINE-N
the same way. All from random weights (nothing downloaded).

Data (bench/quality_data.py): REAL handwritten digits, the UCI "Optical Recognition of Handwritten Digits"
set (Alpaydin & Kaynak 1998; CC BY 4.0, UCI ML Repository), its 1797-digit test part as bundled with
scikit-learn (`sklearn.datasets.load_digits`, offline), split 80/20 by digit. The classifier reads them as
an image folder (PNG, 32 px); the detectors read scenes COMPOSED here from those real digits: 8-16 digits
upscaled to 24-56 px on a black 256 px canvas, exact boxes, COCO JSON (800 train scenes from train digits,
120 validation scenes from validation digits). Both sides read the same PNG files.

What is held equal: model and its constructor arguments; initial weights (both seed torch with the run's
seed before building it: tests/tasks/test_quality_parity.py checks that they are bit-identical); data order
(a seeded permutation per epoch: Musubi's DistributedSampler, the plain loop's DistributedSampler of one
replica, same seed); the GLOBAL batch (Musubi at N GPUs: global / N per rank, so N GPUs see the same samples
per step as one; BatchNorm then normalises over global / N samples a rank, as DDP does without SyncBatchNorm);
epochs, so the number of samples and steps; optimizer, LR, warm-up and cosine schedule (Musubi's
`lr_rule: none`, `base_batch` = the global batch: the LR written is the LR used, which the bench checks from
each run's summary and its logged LR curve); weight decay, gradient clipping; precision (bf16 autocast on
GPU, fp32 on CPU, train and validation); no augmentation on either side; validation every `eval_every`
epochs and at the end (Musubi's rule; the plain loop's --eval-every), on the whole validation split,
BatchNorm with its running averages as trained (Musubi's precise-BN recalibration, `train.bn_recalibrate`,
is set to 0: the plain loop has none): top1, or COCO mAP50 by COCOeval (faster-coco-eval where installed,
else pycocotools: the same backend on both sides). Musubi runs as a user would run it (telemetry on), less
checkpoints and TensorBoard (time, not quality) and CPU pinning (several runs share the machine at once).

Runs are independent, so they share the machine: up to K processes a GPU (a 2-GPU run takes a slot on each),
K the smallest that the --budget-s plan fits (bench/quality_plan.py: each run's start-up, steps and
validations from the recipes' figures, or as measured by an earlier call, --calibrate; `--dry-run --gpus N`
prints the plan). What the plan cannot fit is refused before anything starts; what the budget cuts is killed
and reported as cut, not judged.

A device call lasts at most 10 minutes, the bench's runs may not: `--runs NAME,...` runs a part of the plan,
`--finish A.json` runs what an earlier call left unfinished (its models, seeds, rank counts and recipes) and
writes the merged report beside its own, and `bench/quality.py merge A.json B.json` merges result files of
the same recipes, data and card kind into one report with the verdicts over all their seeds
(bench/quality_merge.py).

On a lent 2-GPU machine (no network; the device call carries `.whl`: pydantic 2.14.4, pydantic-core
2.50.5, annotated-types 0.8.0, typing-inspection 0.4.5, faster-coco-eval 1.8.0 as cp312 manylinux wheels,
see docs/gpu-tier.md; scikit-learn, transformers, scipy and matplotlib are in its image), in one call of
~8.8 minutes planned (at most ~9.4: the budget, 540 s, stops what is left):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
        python3 bench/quality.py --device cuda --nprocs 1,2 --seeds 0,1,2 --work /tmp/quality --out-dir $OUT

and a call that finishes a cut one (the same prefix), then the merged report:

    python3 bench/quality.py --device cuda --finish bench/results/A.json --calibrate bench/results/A.json \
        --budget-s 540 --work /tmp/quality --out-dir $OUT

CPU rehearsal (here; tiny: proves the plumbing, not quality):

    python bench/quality.py --device cpu --nprocs 1,2 --seeds 0 --max-steps 3 --data-scale smoke

Writes quality-DATE-CARD-COMMIT.json (every run's record, the rows, the verdicts), .md (a table and a
verdict per model, for BENCHMARKS.md) and .png (training loss and validation metric against samples seen,
side by side, and every seed's final metric) to --out-dir (default bench/results; -2, -3 added rather than
overwrite a file of the same day and commit) and, where $OUT is set, copies them there with the runs' logs
(-logs.tgz); with --finish also quality-DATE-CARD-COMMIT+COMMIT-merged.{json,md,png}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import quality_data, quality_merge, quality_report  # noqa: E402
from bench.quality_plan import (  # noqa: E402
    BUDGET_S,
    MAX_PER_DEVICE,
    REPORT_S,
    SETUP_S,
    Run,
    choose_per_device,
    estimate_s,
    evaluations,
    first_fit,
    fixed_s,
    order_runs,
    plan_runs,
    read_calibration,
    replan,
    simulate,
    steps_of,
    worst_error,
)
from bench.quality_recipes import DATA_SCALES, DEFAULT_MODELS, RECIPES, Recipe, trained_as  # noqa: E402
from musubi.config.job import TrainSpec  # noqa: E402


# -- one run: its command ------------------------------------------------------------------------------
def split_paths(recipe: Recipe, data: Path) -> dict[str, str]:
    """The train/val folders (and COCO files) of the recipe's set."""
    if recipe.task == "classification":
        return {"train": str(data / "cls" / "train"), "val": str(data / "cls" / "val")}
    det = data / "det"
    return {"train": str(det / "train" / "images"), "train_ann": str(det / "train" / "annotations.json"),
            "val": str(det / "val" / "images"), "val_ann": str(det / "val" / "annotations.json")}


def plain_argv(recipe: Recipe, run: Run, data: Path, device: str, precision: str, workers: int,
               max_steps: int | None, output: Path) -> list[str]:
    """bench/plain_quality_loop.py's command line for this run."""
    p = split_paths(recipe, data)
    argv = [sys.executable, str(REPO / "bench" / "plain_quality_loop.py"), "--task", recipe.task,
            "--model", recipe.model, "--model-args", json.dumps(recipe.model_args), "--train", p["train"],
            "--val", p["val"], "--image-size", str(recipe.image_size), "--epochs", str(recipe.epochs),
            "--batch-size", str(recipe.global_batch), "--opt", recipe.optimizer, "--lr", repr(recipe.lr),
            "--momentum", repr(recipe.momentum), "--wd", repr(recipe.weight_decay),
            "--lr-warmup-steps", str(recipe.warmup_steps), "--eval-every", str(recipe.eval_every or recipe.epochs),
            "--precision", precision, "--seed", str(run.seed),
            "--workers", str(workers), "--log-every", str(recipe.log_every), "--device", device,
            "--output", str(output)]
    if recipe.task == "detection":
        argv += ["--train-ann", p["train_ann"], "--val-ann", p["val_ann"]]
    if recipe.grad_clip:
        argv += ["--clip-grad-norm", repr(recipe.grad_clip)]
    if max_steps:
        argv += ["--max-steps", str(max_steps)]
    return argv


def musubi_job(recipe: Recipe, run: Run, data: Path, precision: str, workers: int,
               max_steps: int | None) -> dict[str, Any]:
    """The Musubi job of this run: the recipe's settings with every default that could differ made explicit."""
    p = split_paths(recipe, data)
    splits = {"train": {"path": p["train"]}, "val": {"path": p["val"]}}
    if recipe.task == "detection":
        splits["train"]["annotations"], splits["val"]["annotations"] = p["train_ann"], p["val_ann"]
    data_spec: dict[str, Any] = {**splits, "image_size": recipe.image_size, "workers": workers, "augment": None}
    if recipe.task == "detection":
        data_spec["gpu_decode"] = False  # PNG: decoded by the loader workers, as the plain loop's
    train: dict[str, Any] = {
        "epochs": recipe.epochs, "global_batch": recipe.global_batch, "optimizer": recipe.optimizer,
        "lr": recipe.lr, "base_batch": recipe.global_batch, "lr_rule": "none", "warmup_steps": recipe.warmup_steps,
        "schedule": "cosine", "momentum": recipe.momentum, "weight_decay": recipe.weight_decay,
        "grad_clip": recipe.grad_clip, "precision": precision, "seed": run.seed, "log_every": recipe.log_every,
        "eval_every": recipe.eval_every or recipe.epochs, "deterministic": False, "channels_last": False, "accumulation": 1,
        "pin_cpus": False, "max_restarts": 0,
    }
    if "bn_recalibrate" in TrainSpec.model_fields:
        # Musubi recomputes BatchNorm statistics before validating by default ("precise BN"); the plain loop,
        # as torchvision's references, validates with the running averages as trained: so does Musubi here.
        train["bn_recalibrate"] = 0
    if max_steps:
        train["max_steps"] = max_steps
    return {"name": run.name, "task": recipe.task, "model": recipe.model, "model_args": dict(recipe.model_args),
            "data": data_spec, "train": train, "checkpoint": {"enabled": False},
            "tracking": {"tensorboard": False}}


def musubi_argv(job_file: Path, run: Run, device: str, out: Path) -> list[str]:
    """`musubi train` of the job (the preflight skipped: the machine is checked once, not 27 times)."""
    return [sys.executable, "-m", "musubi.cli", "train", str(job_file), "--nproc", str(run.nproc), "--out",
            str(out), "--device", device, "--no-check"]


# -- reading a finished run ------------------------------------------------------------------------------
def read_plain(path: Path) -> dict[str, Any]:
    """The plain loop's record: final metrics, loss log, LR, steps."""
    rec = json.loads(path.read_text())
    return {"final": rec["final"], "log": rec["log"], "evals": rec.get("evals", []), "steps": rec["steps"],
            "lr": rec["lr"], "global_batch": rec["global_batch"], "train_s": rec["train_s"],
            "eval_s": rec.get("eval_s")}


def read_musubi(job_dir: Path) -> dict[str, Any]:
    """Musubi's metrics.jsonl (train lines: loss, lr; the last val line: the metrics) and summary.json."""
    lines = [json.loads(ln) for ln in (job_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    log = [{"step": r["step"], "loss": r["loss"], "lr": r["lr"]} for r in lines if r.get("kind") == "train"]
    vals = [r for r in lines if r.get("kind") == "val"]
    summary = json.loads((job_dir / "summary.json").read_text()) if (job_dir / "summary.json").is_file() else {}
    evals = [{k: v for k, v in r.items() if k not in ("kind", "time")} for r in vals]
    final = {k: v for k, v in evals[-1].items() if k != "step"} if evals else {}
    return {"final": final, "log": log, "evals": evals, "steps": summary.get("steps"), "lr": summary.get("lr"),
            "global_batch": summary.get("global_batch"), "train_s": summary.get("train_s")}


# -- running them ---------------------------------------------------------------------------------------
@dataclass
class Launched:
    """A started run: its process (a session of its own, so its whole tree can be stopped), devices, times."""

    run: Run
    proc: subprocess.Popen
    devices: list[int]
    start: float
    sharing: int
    log: Any


def child_env(devices: list[int], device: str, threads: int) -> dict[str, str]:
    """The environment of a run: its GPUs, thread count, the repo importable, nothing fetched, no NVLS."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices)) if device == "cuda" else ""
    env["OMP_NUM_THREADS"] = str(threads)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        env.setdefault(k, "0" if k == "NCCL_NVLS_ENABLE" else "1")  # keep NVLink multicast off (shared hosts)
    return env


def stop(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """End the runs' process groups (each run and everything it started): SIGTERM to all, SIGKILL to what is
    left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(p.poll() is None for p in procs):
            time.sleep(0.2)


def execute(runs: list[Run], args: argparse.Namespace, data: Path, work: Path, devices: int, per_device: int,
            deadline: float) -> dict[Run, dict[str, Any]]:
    """Start runs as slots free up (list scheduling, as `simulate`); stop what is running at the deadline."""
    load = [0] * devices
    queue, running, outcome = list(runs), [], {}
    threads = max(1, (os.cpu_count() or 2) // max(1, devices * per_device)) if args.device == "cuda" else \
        max(1, (os.cpu_count() or 2) // 2)
    try:
        schedule(queue, running, outcome, load, per_device, devices, deadline, args, data, work, threads)
    finally:  # an interrupt or an error here leaves no run behind (they run in sessions of their own)
        stop([item.proc for item in running])
    return outcome


def schedule(queue: list[Run], running: list[Launched], outcome: dict[Run, dict[str, Any]], load: list[int],
             per_device: int, devices: int, deadline: float, args: argparse.Namespace, data: Path, work: Path,
             threads: int) -> None:
    """`execute`'s loop: collect finished runs, stop all at the deadline, start what fits."""
    while queue or running:
        for item in list(running):
            if item.proc.poll() is not None:
                running.remove(item)
                for d in item.devices:
                    load[d] -= 1
                outcome[item.run] = finish(item, args, work, "ok" if item.proc.returncode == 0 else
                                           f"exit {item.proc.returncode}")
        if time.monotonic() > deadline:
            stop([item.proc for item in running])
            for item in running:
                for d in item.devices:
                    load[d] -= 1
                outcome[item.run] = finish(item, args, work, "cut by the budget")
            running.clear()
            for run in queue:
                outcome[run] = {"status": "not started (budget)", "wall_s": 0.0}
            return
        fit = first_fit(queue, load, per_device, devices)
        if fit is None:
            time.sleep(0.5)
            continue
        queue.remove(fit)
        devs = sorted(range(devices), key=lambda d: load[d])[: min(fit.nproc, devices)]
        sharing = max(load[d] for d in devs)
        for d in devs:
            load[d] += 1
        running.append(launch(fit, args, data, work, devs, sharing, threads))
        print(f"[{time.strftime('%H:%M:%S')}] start {fit.name} on {args.device} {devs} (sharing with {sharing})",
              flush=True)


def launch(run: Run, args: argparse.Namespace, data: Path, work: Path, devs: list[int], sharing: int,
           threads: int) -> Launched:
    """Start one run in its own folder and process session."""
    recipe = args.recipes[run.model]
    folder = work / "runs" / run.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    precision = "bf16" if args.device == "cuda" else "fp32"
    if run.side == "plain":
        argv = plain_argv(recipe, run, data, args.device, precision, args.workers, args.max_steps,
                          folder / "plain.json")
    else:
        job = folder / "job.yaml"
        job.write_text(yaml.safe_dump(musubi_job(recipe, run, data, precision, args.workers, args.max_steps)))
        argv = musubi_argv(job, run, args.device, folder / "run")
    (folder / "command.txt").write_text(" ".join(argv) + "\n")
    log = open(folder / "output.log", "w")
    proc = subprocess.Popen(argv, cwd=REPO, env=child_env(devs, args.device, threads), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    return Launched(run, proc, devs, time.monotonic(), sharing, log)


def finish(item: Launched, args: argparse.Namespace, work: Path, status: str) -> dict[str, Any]:
    """The run's record: what it measured (where it got that far) and how it ended."""
    item.log.close()
    run, folder = item.run, work / "runs" / item.run.name
    rec: dict[str, Any] = {"status": status, "wall_s": round(time.monotonic() - item.start, 1),
                           "start_s": round(item.start - args.t0, 1), "sharing": item.sharing,
                           "devices": item.devices}
    try:
        got = read_plain(folder / "plain.json") if run.side == "plain" else read_musubi(folder / "run" / run.name)
    except (OSError, ValueError, KeyError) as e:
        got = {"read_error": f"{type(e).__name__}: {e}"}
    rec.update(got)
    if run.side == "musubi" and status.startswith("exit") and rec.get("final"):
        # `musubi train` exits 1 when its checklist is not met (e.g. a loss judged not falling) after a
        # complete run: the run is measured all the same, and its status says so.
        rec["status"], rec["musubi_exit"] = "ok", status
    if not rec.get("final") and rec["status"] == "ok":
        rec["status"] = "no validation"
    if rec["status"] != "ok":
        tail = (folder / "output.log").read_text(errors="replace").splitlines()[-15:]
        rec["output_tail"] = tail
        print(f"  {run.name}: {rec['status']}\n    " + "\n    ".join(tail), flush=True)
    else:
        print(f"[{time.strftime('%H:%M:%S')}] done {run.name} in {rec['wall_s']} s: "
              f"{args.recipes[run.model].metric} {rec['final'].get(args.recipes[run.model].metric)}", flush=True)
    return rec


# -- the whole bench ------------------------------------------------------------------------------------------
def device_count(device: str) -> int:
    """GPUs visible (cuda), or 1 (the CPU, one run at a time)."""
    if device == "cpu":
        return 1
    import torch

    return torch.cuda.device_count()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="`bench/quality.py merge A.json B.json` "
                                 "merges result files into one report (bench/quality_merge.py)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--nprocs", default=None, help="Musubi's rank counts besides the plain loop (default 1,4 on "
                    "cuda, 1,2 on cpu)")
    ap.add_argument("--seeds", default=None, help="seeds (default 0,1,2)")
    ap.add_argument("--models", default=None, help=f"from {', '.join(RECIPES)} (default {','.join(DEFAULT_MODELS)})")
    ap.add_argument("--runs", default=None, help="NAME,...: only these runs of the plan (names as in the report, "
                    "e.g. detr-musubi2-s1,detr-plain-s2)")
    ap.add_argument("--finish", default=None, help="A.json[,B.json]: run what these earlier calls left (every run of "
                    "their models, seeds and rank counts not finished in them, trained as their recipes say), then "
                    "write this call's report and the merged one")
    ap.add_argument("--budget-s", type=float, default=None, help=f"wall time for all the runs (default {BUDGET_S:.0f} on "
                    "cuda, 7200 on cpu); a plan that does not fit is refused, the runs still going at its end are "
                    "stopped")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to use, 0..N-1 (default: every visible one; "
                    "with --dry-run, plan for N GPUs on a machine without them)")
    ap.add_argument("--max-per-device", type=int, default=MAX_PER_DEVICE, help="most runs sharing one GPU "
                    f"(default {MAX_PER_DEVICE}: the most its slow-down rule was checked at)")
    ap.add_argument("--per-device", type=int, default=None, help="runs a GPU at once (default: the fewest that "
                    "fit the budget)")
    ap.add_argument("--max-steps", type=int, default=None, help="cap every run's steps (rehearsals); the "
                    "cosine ends there on both sides")
    ap.add_argument("--data-scale", choices=sorted(DATA_SCALES), default=None, help="full (default) or smoke")
    ap.add_argument("--workers", type=int, default=2, help="data-loader workers a rank, both sides")
    ap.add_argument("--work", type=Path, default=None, help="data and run folders (default a temporary folder)")
    ap.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--calibrate", type=Path, default=None, help="an earlier call's result JSON: plan with the "
                    "start-up, step and validation times it measured")
    ap.add_argument("--epochs", default="", help="MODEL=N,...: train those models N epochs instead of their "
                    "recipe's (e.g. a second call for the detectors alone: cnn_detector=6,detr=6)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    a = ap.parse_args(argv)
    a.recipes = dict(RECIPES)  # this run's recipes: RECIPES with --epochs applied (or the finished calls')
    a.earlier = []
    if a.finish:
        finish_from(a, ap)
    a.nprocs = [int(n) for n in (a.nprocs or ("1,4" if a.device == "cuda" else "1,2")).split(",")]
    a.seeds = [int(s) for s in (a.seeds or "0,1,2").split(",")]
    a.models = [m for m in (a.models or ",".join(DEFAULT_MODELS)).split(",") if m]
    a.data_scale = a.data_scale or "full"
    unknown = sorted(set(a.models) - set(RECIPES))
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(RECIPES)}")
    for item in filter(None, a.epochs.split(",")):
        key, _, n = item.partition("=")
        if key not in RECIPES or not n.isdigit() or int(n) < 1:
            ap.error(f"--epochs: {item!r} is not MODEL=N with MODEL from {', '.join(RECIPES)} and N >= 1")
        a.recipes[key] = replace(RECIPES[key], epochs=int(n))
    if a.budget_s is None:
        a.budget_s = BUDGET_S if a.device == "cuda" else 7200.0
    return a


def finish_from(a: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    """--finish: the earlier calls' files (refused unless they merge), and this call's settings from them."""
    given = [flag for flag, value in (("--models", a.models), ("--seeds", a.seeds), ("--nprocs", a.nprocs),
                                      ("--epochs", a.epochs), ("--max-steps", a.max_steps),
                                      ("--data-scale", a.data_scale)) if value]
    if given:
        ap.error(f"--finish takes {', '.join(given)} from the earlier calls' files; leave {given[0]} out "
                 "(--runs picks a part of what is left)")
    try:
        a.earlier = [(p, quality_merge.load(Path(p))) for p in a.finish.split(",") if p]
        quality_merge.check(a.earlier)
        if len(a.earlier) > 1:  # a run finished in two of them: refused now, not after this call's runs
            quality_merge.merge(a.earlier)
        a.recipes.update(trained_as({k: v for _, r in a.earlier for k, v in r["recipes"].items()}))
    except (quality_merge.MergeRefused, ValueError) as e:
        ap.error(f"--finish: {e}")
    first = a.earlier[0][1]
    if first["device"] != a.device:
        ap.error(f"--finish: the earlier calls ran on {first['device']}; pass --device {first['device']}")
    scale = [k for k, v in DATA_SCALES.items() if asdict(v) == first["data"].get("params")]
    if not scale:
        ap.error("--finish: the earlier calls' data are neither --data-scale full nor smoke; rerun them")
    a.models = ",".join(dict.fromkeys(m for _, r in a.earlier for m in r["recipes"]))
    a.seeds = ",".join(str(s) for s in sorted({s for _, r in a.earlier for s in r["seeds"]}))
    a.nprocs = ",".join(str(n) for n in sorted({n for _, r in a.earlier for n in r["nprocs"]}))
    a.max_steps, a.data_scale = first.get("max_steps"), scale[0]


def check_card(earlier: list[tuple[str, dict[str, Any]]], card_text: str | None = None) -> None:
    """--finish on GPUs: refuse before any run starts when this machine's cards are not the earlier calls' (the
    merge would refuse the runs after they cost their time)."""
    from bench.gpu_tier import card

    here = quality_merge.card_kind(card_text if card_text is not None else card()[1])
    there = quality_merge.card_kind(earlier[0][1]["card"])
    if here != there:
        raise SystemExit(f"--finish: this machine has {here or 'no GPU'}, {earlier[0][0]} ran on {there}: runs on "
                         "other cards are not merged with them; finish on the same kind of card, or start anew")


def chosen_runs(a: argparse.Namespace) -> list[Run]:
    """The runs of this call: the plan of --models, --seeds, --nprocs, less what --finish's files finished,
    restricted to --runs."""
    runs = plan_runs(a.models, a.seeds, a.nprocs)
    done = {r["name"] for _, result in a.earlier for r in result["records"] if r["status"] == "ok"}
    runs = [r for r in runs if r.name not in done]
    if a.runs:
        wanted = [n for n in a.runs.split(",") if n]
        unknown = sorted(set(wanted) - {r.name for r in plan_runs(a.models, a.seeds, a.nprocs)})
        if unknown:
            raise SystemExit(f"--runs: {', '.join(unknown)} not in the plan of --models/--seeds/--nprocs "
                             f"(names look like {runs[0].name if runs else 'detr-musubi2-s1'}); fix the names")
        finished = sorted(set(wanted) & done)
        if finished:
            raise SystemExit(f"--runs: {', '.join(finished)} already finished in --finish's files; leave them out")
        runs = [r for r in runs if r.name in wanted]
    if not runs:
        raise SystemExit("nothing to run: every run of the plan finished in --finish's files (merge them: "
                         "bench/quality.py merge A.json B.json)")
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        return quality_merge.main(argv[1:])
    a = parse_args(argv)
    t0 = a.t0 = time.monotonic()
    params = DATA_SCALES[a.data_scale]
    visible = device_count(a.device)
    devices = a.gpus if a.device == "cuda" and a.gpus else visible
    if a.device == "cuda" and devices > visible and not a.dry_run:
        raise SystemExit(f"--gpus {devices}: only {visible} GPUs visible")
    if a.earlier and a.device == "cuda" and not a.dry_run:
        check_card(a.earlier)
    runs = chosen_runs(a)
    if a.device == "cuda" and max(r.nproc for r in runs) > devices:
        raise SystemExit(f"--nprocs {max(r.nproc for r in runs)} needs {max(r.nproc for r in runs)} GPUs; "
                         f"{devices} visible")
    for r in runs:
        if a.recipes[r.model].global_batch % r.nproc:
            raise SystemExit(f"{r.model}: global batch {a.recipes[r.model].global_batch} does not split over "
                             f"{r.nproc} ranks; change --nprocs")
    try:
        calibration = read_calibration(a.calibrate)
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"--calibrate {a.calibrate}: {type(e).__name__}: {e}; pass one call's result JSON") from e
    if a.calibrate:
        print(calibration_text(a.calibrate, calibration), flush=True)
    est = {r: estimate_s(r, a.recipes[r.model], steps_of(a.recipes[r.model], params, a.max_steps), a.device,
                         calibration, params) for r in runs}
    runs = order_runs(runs, est)
    fixed = {r: fixed_s(r, a.recipes[r.model], a.device, est[r], calibration) for r in runs}
    runs_budget = a.budget_s - SETUP_S  # the data are written inside the budget
    if a.device == "cpu":
        per, tried = 1, {1: simulate(runs, est, 1, 1, fixed)[0]}
        fits = tried[1] <= runs_budget
    elif a.per_device:
        per, tried = a.per_device, {a.per_device: simulate(runs, est, devices, a.per_device, fixed)[0]}
        fits = tried[per] <= runs_budget
    else:
        chosen, tried = choose_per_device(runs, est, devices, runs_budget, a.max_per_device, fixed)
        per, fits = chosen or a.max_per_device, chosen is not None
    print(plan_text(a, runs, est, params, devices, tried), flush=True)
    if not fits:
        raise SystemExit(f"the plan does not fit --budget-s {a.budget_s:.0f} (estimate {SETUP_S + min(tried.values()):.0f}"
                         " s at best with the data): fewer --seeds, --models or --runs, or a larger budget")
    print(f"running {per} a device at once: about {SETUP_S + tried[per] + REPORT_S:.0f} s for the whole command",
          flush=True)
    if a.dry_run:
        return 0
    work = a.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"musubi-quality-{os.getpid()}"
    data = work / f"data-{a.data_scale}"
    record = quality_data.write_sets(data, params)
    print(f"data: {data} ({record['classification']}, {record['detection']}; {time.monotonic() - t0:.1f} s)",
          flush=True)
    deadline = t0 + a.budget_s
    outcome = execute(runs, a, data, work, devices, per, deadline)
    return report(a, runs, outcome, record, per, tried, time.monotonic() - t0, work, est)


def calibration_text(path: Path, calibration: dict[str, Any]) -> str:
    """What --calibrate read, and how well this plan replays that call with it (its worst finished run)."""
    result = json.loads(path.read_text())
    name, err = worst_error(result, replan(result, trained_as(result["recipes"]), calibration))
    return (f"calibration: {len(calibration)} configurations from {path.name}; replayed with them, the plan puts "
            f"that call's finished runs within {abs(err):.0%} of their wall times (worst: {name}, {err:+.0%})")


def plan_text(a: argparse.Namespace, runs: list[Run], est: dict[Run, float], params: quality_data.DataParams,
              devices: int, tried: dict[int, float]) -> str:
    """The plan: per model its steps, validations and each configuration's estimated run time alone, then the
    makespan by runs a device."""
    where = "GPU" if a.device == "cuda" else "CPU"
    seeds = sorted({r.seed for r in runs})
    lines = [f"plan: {len(runs)} runs ({', '.join(dict.fromkeys(r.model for r in runs))}; seeds {seeds}; "
             f"{', '.join(dict.fromkeys(r.name.split('-')[-2] for r in runs))}) on {devices} {where}"
             f"{'s' if devices > 1 else ''}"]
    for m in dict.fromkeys(r.model for r in runs):
        r = a.recipes[m]
        steps = steps_of(r, params, a.max_steps)
        alone: dict[str, float] = {}
        for x in runs:
            if x.model == m:
                alone.setdefault("plain" if x.side == "plain" else f"musubi{x.nproc}", est[x])
        lines.append(f"  {m}: {r.model}, {steps} steps x {r.global_batch}, {evaluations(r, steps, params)} "
                     "validations; s a run alone: " + ", ".join(f"{k} {v:.0f}" for k, v in alone.items()))
    if a.earlier or a.runs:  # a part of the plan: which part
        lines.append("  runs: " + ", ".join(r.name for r in runs))
    lines.append(f"estimated makespan by runs a device (+{SETUP_S:.0f} s of data first): "
                 + ", ".join(f"{k}: {v:.0f} s" for k, v in tried.items()) + f"; budget {a.budget_s:.0f} s")
    return "\n".join(lines)


def report(a: argparse.Namespace, runs: list[Run], outcome: dict[Run, dict[str, Any]], data_record: dict,
           per: int, tried: dict[int, float], wall: float, work: Path, est: dict[Run, float] | None = None) -> int:
    """Records, rows, verdicts; the JSON, the table and the plot (and, with --finish, the merged report's); a
    copy under $OUT."""
    from bench.gpu_tier import card, versions
    from bench.provenance import commit

    records = []
    plain_logs = {(r.model, r.seed): outcome[r].get("log") for r in runs if r.side == "plain"}
    for r in runs:
        rec = {**asdict(r), "name": r.name, **outcome[r]}
        if est:
            rec["estimate_alone_s"] = round(est[r], 1)  # the plan's figure, beside the measured wall_s and sharing
        if r.side == "musubi" and "lr" in rec:
            recipe = a.recipes[r.model]
            rec["lr_check"] = quality_report.lr_check(rec, recipe.lr, recipe.global_batch,
                                                      plain_logs.get((r.model, r.seed)))
        records.append(rec)
    models = {m: asdict(a.recipes[m]) for m in dict.fromkeys(r.model for r in runs)}
    nprocs = sorted({r.nproc for r in runs if r.side == "musubi"}) or a.nprocs
    rows = quality_report.summarise(records, models, nprocs)
    tag, card_text = card() if a.device == "cuda" else ("cpu", f"{os.cpu_count()} CPU cores")
    word = "GPUs" if a.device == "cuda" else "CPU ranks"
    sha = commit()
    stem = free_stem(a.out_dir, f"quality-{dt.date.today().isoformat()}-{tag}-{sha.replace('+dirty', '-dirty')}")
    seeds = sorted({r.seed for r in runs})
    result = {"bench": "quality", "commit": sha, "card": card_text, "versions": versions(),
              "command": " ".join(sys.argv), "device": a.device, "nprocs": nprocs, "seeds": seeds,
              "runs_per_device": per, "estimated_makespan_s": tried, "wall_s": round(wall, 1),
              "budget_s": a.budget_s, "max_steps": a.max_steps, "data": data_record,
              "recipes": models, "rows": rows, "verdicts": quality_report.model_verdicts(rows), "records": records}
    head = (f"Quality parity, {card_text}, commit {sha}, {dt.date.today().isoformat()}: `{' '.join(sys.argv)}` "
            f"({len(seeds)} seeds, {per} runs a device at once, {wall:.0f} s)\n\n")
    paths = quality_report.write_files(result, a.out_dir, stem, head, word)
    print("\n" + head + quality_report.markdown(rows, word), flush=True)
    print(f"wrote {', '.join(str(p) for p in paths)}", flush=True)
    if a.earlier:
        try:
            result, merged_paths, text = quality_merge.write([*a.earlier, (str(paths[0]), result)], a.out_dir)
        except quality_merge.MergeRefused as e:  # checked before the runs: only a changed data record lands here
            print(f"merge refused: {e}", flush=True)
            return 2
        print("\n" + text + f"\nwrote {', '.join(str(p) for p in merged_paths)}", flush=True)
        paths += merged_paths
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        for p in paths:
            if (out / p.name).resolve() != p.resolve():  # --out-dir $OUT: already there
                shutil.copy(p, out / p.name)
        archive_logs(work, out / f"{stem}-logs.tgz")
    return 0 if quality_merge.passed(result) else 1


def free_stem(out_dir: Path, stem: str) -> str:
    """`stem`, or stem-2, -3, ...: a second call of the day at the same commit (finishing the first) must not
    overwrite the first call's files."""
    n, free = 1, stem
    while (out_dir / f"{free}.json").exists():
        n += 1
        free = f"{stem}-{n}"
    return free


def archive_logs(work: Path, path: Path) -> None:
    """Each run's command, output and (Musubi) job files, no weights or telemetry."""
    keep = {"command.txt", "output.log", "plain.json", "job.yaml", "metrics.jsonl", "summary.json", "job.json",
            "eval.json"}
    with tarfile.open(path, "w:gz") as tar:
        for p in sorted((work / "runs").rglob("*")):
            if p.is_file() and p.name in keep and "telemetry" not in p.parts:
                tar.add(p, arcname=str(p.relative_to(work)))


if __name__ == "__main__":
    sys.exit(main())
