"""A job's start-up, component by component: the marks its processes append to JOB/startup.jsonl.

Each process of a job appends one line per mark as it passes it (`{"mark", "time"}`, wall-clock
seconds), so the start-up of an attempt reads as the gaps between consecutive marks:

    spawned      the fleet started `musubi train` (or the external command); kept in fleet.json's
                 attempt history, not in the file (the job's folder must not exist before `musubi train`)
    entered      `musubi train`'s command began: Python started, the CLI imported (the API: launch_train called)
    admitted     the job's checks passed: config, resume, world size (the device count: torch, NVML; the
                 CUDA driver is left to the ranks), the task's own checks (the model built on the meta device:
                 torch, torchvision);
                 a fleet's job skips the last two, which the fleet made before starting it
    prepared     the preflight (unless --no-check) and the run's records (env.json: NVML, topology) written
    launcher     `musubi train` is about to start torchrun (interpreter, CLI imports, job.json)
    worker       rank 0's process was created (torchrun's agent started it)
    imported     rank 0 imported torch and musubi
    world        rendezvous and process group up (NCCL's communicator is created eagerly here)
    gate         the job's GPUs are free of the previous job's evaluation (overlapped start-up only)
    batch        the per-rank batch is decided (the autobatch probe, when on)
    model        model built and wrapped (DDP's first broadcast), optimizer, data loaders, telemetry
    fit          the training loop starts (after a resume's checkpoint load)
    first_batch  (inside the first step) its first batch arrived (loader workers started)
    first_forward   its first micro-batch's forward finished on the device (cudnn autotuning, lazy CUDA)
    first_backward  that micro-batch's backward finished on the device
    first_step   the first optimizer step ended (loader workers started, cudnn autotuned, allocator warm)
    trained      the loop ended (training, in-loop validation, the last checkpoint committed)
    train_exit   the fleet saw the training processes exit (process group and interpreter teardown)
    eval_spawned the fleet started the evaluation step (before training ends when it is pre-started)
    eval_ready   the evaluation step imported torch and musubi.evaluate
    evaluated    the evaluation step finished (metrics, FPS)

Rank 0 alone writes the per-rank marks; the others start alike. Used by the fleet (fleet.json, the
summary) and by `musubi report`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from musubi.contract.records import StartupMark
from musubi.contract.run_files import RUN_FILES
from musubi.store.rundir import read_jsonl

#: (component, from mark, to mark) in the order of an attempt; a missing mark is skipped (the component then
#: runs from the last mark present).
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("python + CLI import", "launcher"),
    ("torchrun agent", "worker"),
    ("rank import (python, torch)", "imported"),
    ("rendezvous + process group", "world"),
    ("waiting for the GPU (overlapped)", "gate"),
    ("batch decision", "batch"),
    ("model, optimizer, loaders", "model"),
    ("resume", "fit"),
    ("first step", "first_step"),
)
#: The first step's parts (from the `fit` mark), where the worker wrote them (worker/step_events.FirstStepMarks);
#: reported beside the components, whose "first step" holds them all.
FIRST_STEP: tuple[tuple[str, str], ...] = (
    ("first step: batch", "first_batch"),
    ("first step: forward", "first_forward"),
    ("first step: backward", "first_backward"),
    ("first step: optimizer and the rest", "first_step"),
)
#: The launcher's parts (from `spawned`, where `musubi train` wrote them): reported beside the components, whose
#: "python + CLI import" holds them all.
LAUNCHER: tuple[tuple[str, str], ...] = (
    ("launcher: python, imports", "entered"),
    ("launcher: job checks", "admitted"),
    ("launcher: preflight, run records", "prepared"),
    ("launcher: pinning, torchrun command", "launcher"),
)
#: The evaluation step's Python start and imports after training ended (0 when it was pre-started).
EVAL_START = "evaluation start (python, imports)"
#: The evaluation step's parts (from its start: the later of ready and training's end), where it marked them:
#: reported beside "evaluation", which holds them all. A task job's step loads the model (checkpoint, build,
#: onto the GPU), times it (the FPS protocol), exports it when the fleet asked and it ranks, and writes eval.json.
EVALUATION: tuple[tuple[str, str], ...] = (
    ("evaluation: model load", "eval_loaded"),
    ("evaluation: FPS", "eval_fps"),
    ("evaluation: export", "eval_exported"),
    ("evaluation: the rest", "evaluated"),
)
#: The evaluation step's last use of the GPU (its FPS measured, eval.json written): the fleet hands the job's GPUs to
#: the job gated behind it from here, so what follows (an early export, on the CPU) runs beside that job's start.
EVAL_GPU_DONE = "eval_gpu_done"


def mark(job_dir: Path, name: str, when: float | None = None) -> None:
    """Append one mark (never raises: a start-up record is evidence, not a reason to fail a job)."""
    try:
        job_dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps(StartupMark(mark=name, time=round(time.time() if when is None else when, 4),
                                      pid=os.getpid()))
        with open(job_dir / RUN_FILES.startup, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError:
        pass


def marks_of(job_dir: Path, since: float | None = None, until: float | None = None) -> dict[str, float]:
    """The first time of each mark within [since, until] (one attempt), from JOB/startup.jsonl."""
    out: dict[str, float] = {}
    for rec in read_jsonl(job_dir / RUN_FILES.startup):
        t, name = rec.get("time"), rec.get("mark")
        if not isinstance(t, (int, float)) or not isinstance(name, str):
            continue
        if (since is not None and t < since - 1e-3) or (until is not None and t > until + 1e-3):
            continue
        out.setdefault(name, float(t))
    return out


def components(marks: Mapping[str, float]) -> dict[str, float]:
    """Seconds of each start-up component present (see COMPONENTS), "to first step", "start-up on the
    GPUs" (from the gate when there is one), then teardown and the evaluation step (its start after
    training ended: 0 when it was pre-started and ready)."""
    out: dict[str, float] = {}
    if "spawned" not in marks:
        return out
    last = chain(marks, marks["spawned"], COMPONENTS, out)
    if out:  # an external command passes none of these marks: its start-up is its own
        out["to first step"] = round(last - marks["spawned"], 3)
        # What the GPUs spent on it: from the gate (the previous job's evaluation over) when there is one.
        out["start-up on the GPUs"] = round(last - max(marks["spawned"], marks.get("gate", marks["spawned"])), 3)
    if "launcher" in marks:
        _inner(marks, marks["spawned"], LAUNCHER, out)
    if "fit" in marks and "first_step" in marks:
        _inner(marks, marks["fit"], FIRST_STEP, out)
    if "trained" in marks and "train_exit" in marks:
        out["teardown"] = round(max(0.0, marks["train_exit"] - marks["trained"]), 3)
    if "train_exit" in marks and "eval_ready" in marks:  # a pre-started step was ready before: 0
        out[EVAL_START] = round(max(0.0, marks["eval_ready"] - marks["train_exit"]), 3)
        if "evaluated" in marks:
            begun = max(marks["eval_ready"], marks["train_exit"])
            out["evaluation"] = round(max(0.0, marks["evaluated"] - begun), 3)
            _inner(marks, begun, EVALUATION, out)
    return out


def _inner(marks: Mapping[str, float], start: float, parts: tuple[tuple[str, str], ...],
           out: dict[str, float]) -> None:
    """The parts of a component whose last mark ends it (LAUNCHER, FIRST_STEP, EVALUATION), when its process
    marked any part inside (older runs did not: no parts)."""
    if any(to in marks for _, to in parts[:-1]):
        chain(marks, start, parts, out)


def chain(marks: Mapping[str, float], start: float, parts: tuple[tuple[str, str], ...],
          out: dict[str, float]) -> float:
    """Seconds of each part present, from the mark before it (a missing mark is skipped: the next part runs
    from the last one present), into `out`; returns the last mark's time. A job's start-up and `musubi run`'s
    own (fleet/run.py startup_parts) read their marks this way."""
    last = start
    for name, to in parts:
        if to in marks:
            out[name] = round(max(0.0, marks[to] - last), 3)
            last = max(last, marks[to])
    return last


def _inside(comp: Mapping[str, float], group: tuple[tuple[str, str], ...], label: str) -> str:
    """" (LABEL: part s, ...)" of a group's parts present in `comp`, each named without its group prefix."""
    inside = ", ".join(f"{k.split(': ', 1)[1]} {comp[k]:.1f}" for k, _ in group if k in comp)
    return f" ({label}{inside})" if inside else ""


def summary_line(comp: Mapping[str, float], unit: str = "GPU") -> str:
    """One line: seconds to the first step, on the job's devices (`unit`: GPU or CPU slot), each component, and
    the evaluation step."""
    if "to first step" not in comp:
        return "no start-up marks"
    skip = {"to first step", "start-up on the GPUs", "teardown", EVAL_START, "evaluation",
            *(k for k, _ in FIRST_STEP), *(k for k, _ in LAUNCHER), *(k for k, _ in EVALUATION)}
    parts = ", ".join(f"{k} {v:.1f}" for k, v in comp.items() if k not in skip and v >= 0.05)
    parts += _inside(comp, LAUNCHER, "launcher: ") + _inside(comp, FIRST_STEP, "first step: ")
    tail = ", ".join(f"{k} {comp[k]:.1f}" for k in ("teardown", EVAL_START, "evaluation") if k in comp)
    tail += _inside(comp, EVALUATION, "")
    return (f"{comp['to first step']:.1f} s to the first step ({comp['start-up on the GPUs']:.1f} s of it on the "
            f"{unit}s): {parts}" + (f"; after training: {tail}" if tail else ""))


def wait_for_file(path: Path, owner_alive: Callable[[], bool], poll_s: float = 0.05) -> bool:
    """Block until `path` exists (True), or until `owner_alive()` says the process that was to write it is
    gone (False): the gate a fleet job waits at and the pre-started evaluation step's start signal."""
    while not path.exists():
        if not owner_alive():
            return False
        time.sleep(poll_s)
    return True
