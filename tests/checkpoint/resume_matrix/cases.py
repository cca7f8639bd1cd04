"""The resume matrix's cases and its check: stopped and resumed == never stopped, bit for bit.

Each case trains a tiny job uninterrupted, then the same job stopped at the given steps
(`--max-steps k`) and resumed (`--resume`) until its end, on 2 gloo CPU ranks with
`train.deterministic: true` and a data-loader worker per rank. Every checkpoint step both runs
committed is compared: every tensor (weights, BatchNorm buffers, optimizer state, each rank's
RNG streams) bitwise, and the trainer state (`state.json`: step, data position, scheduler,
scaler, last validation) equal but for the validation's wall time. Where both checkpoints' shard
files are byte for byte the same with the same index (`same_shards`), their tensors are bitwise the
same without reading them; otherwise they are read and compared one by one. All cases are bitwise on CPU:
the CPU kernels these models use are deterministic, so no tolerance is needed.

One uninterrupted run serves every stop of its case: a case with two stops resumes twice in a
row (k1, then k2, then the end). The cases live in several test files (one or two a file), so
that `make test`'s workers, which take a file at a time, share them out.
"""

from __future__ import annotations

import filecmp
import json
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml

from musubi.checkpoint.committed import Committed
from musubi.tasks import detr
from tests.support.runs import bitwise_equal, committed_steps, every_tensor, train
from tests.tasks.detr_tiny import TINY_DFINE, TINY_RTDETR

#: Every file of the matrix: end to end (torchrun), and a case's 3-4 launches well inside this timeout.
MARKS = [pytest.mark.slow, pytest.mark.timeout(420)]

# The synthetic detector of examples/detect-synthetic.yaml, on 64-pixel images.
_RCNN_ARGS = {"rpn_pre_nms_top_n_train": 100, "rpn_post_nms_top_n_train": 50, "rpn_batch_size_per_image": 32,
              "box_batch_size_per_image": 32}

#: case -> (job, stops). Every job: 2 ranks, 1 loader worker per rank, deterministic, saves kept.
CASES: dict[str, tuple[dict[str, Any], list[int]]] = {
    # BatchNorm under DDP, gradient accumulation, stopped mid-epoch (a stop at an epoch's end would not
    # test the save: the validation before it already made the ranks agree); the classifier's default
    # augmentation (crop, flip, colour on the device, seeded per sample and epoch) across the epoch boundary.
    "classification-resnet18-ddp-accumulation": ({
        "task": "classification", "model": "resnet18",
        "data": {"synthetic": {"train_size": 48, "val_size": 16, "image_size": 32, "num_classes": 4}, "augment": {}},
        "train": {"epochs": 2, "batch": 4, "accumulation": 2, "lr": 0.05, "base_batch": 16, "warmup_steps": 1},
        "checkpoint": {"every_steps": 2},
    }, [2]),
    # The demo, smaller: torchvision's detector with BatchNorm in its backbone and FPN.
    "detection-fasterrcnn-ddp": ({
        "task": "detection", "model": "fasterrcnn_mobilenet_v3_large_320_fpn", "model_args": _RCNN_ARGS,
        # 12 images: 3 steps of 2 x 2, stopped at 2 (mid-epoch), as the DETR cases (16 took a 4th step twice)
        "data": {"synthetic": {"train_size": 12, "val_size": 4, "image_size": 64, "num_classes": 2, "objects": 2,
                               "min_object": 12, "max_object": 32}},
        "train": {"epochs": 1, "batch": 2, "optimizer": "adamw", "lr": 0.001, "base_batch": 4, "warmup_steps": 1,
                  "grad_clip": 10.0},
        "checkpoint": {"every_steps": 2},
    }, [2]),
    # transformers' DETR family (extra `transformers`): Hungarian matching and denoising queries drawn from
    # the global RNG every step, BatchNorm in the backbone and encoder; tiny configs of tests/tasks/test_detr.py.
    **{f"detection-{model}-ddp": ({
        "task": "detection", "model": model, "model_args": tiny,
        "data": {"synthetic": {"train_size": 12, "val_size": 4, "image_size": 64, "num_classes": 2, "objects": 2,
                               "min_object": 12, "max_object": 32}},
        "train": {"epochs": 1, "batch": 2, "optimizer": "adamw", "lr": 0.001, "base_batch": 4, "warmup_steps": 1,
                  "grad_clip": 10.0},
        "checkpoint": {"every_steps": 2},
    }, [2]) for model, tiny in (("rtdetr_r18", TINY_RTDETR), ("dfine_s", TINY_DFINE))},
    # The GPT sharded with FSDP2 (DTensor parameters and optimizer state), with accumulation.
    "lm-gpt-fsdp-accumulation": ({
        "task": "lm", "model": "gpt", "model_args": {"layers": 2, "hidden": 32, "heads": 2},
        "data": {"synthetic": {"train_size": 64, "val_size": 16, "seq_len": 16, "vocab": 64}},
        "train": {"epochs": 1, "batch": 4, "accumulation": 2, "optimizer": "adamw", "lr": 0.001, "base_batch": 16,
                  "warmup_steps": 1, "strategy": "fsdp"},
        "checkpoint": {"every_steps": 2},
    }, [2]),
    # A user task with BatchNorm under FSDP2, which never broadcasts buffers by itself.
    "user-task-batchnorm-fsdp-accumulation": ({
        "task": "tests.support.tiny_task:make", "model": "mlp", "model_args": {"batchnorm": True},
        "data": {"synthetic": {"train_size": 64, "val_size": 16}},
        "train": {"epochs": 2, "batch": 4, "accumulation": 2, "lr": 0.1, "base_batch": 16, "strategy": "fsdp"},
        "checkpoint": {"every_steps": 3},
    }, [3, 6]),
}

# Both FSDP2 cases hung now and then after an epoch's last step (one was skipped for it): a rank waited forever for
# its validation loader's worker, which had never returned from os.fork(), forked while a gloo thread of the rank
# entered Python (python/cpython#112275, Python before 3.11.10). Ranks on such a Python now make every fork wait
# for a quiet rank (musubi/worker/fork_guard.py).


def params(*names: str) -> list[Any]:
    """The named cases as pytest parameters, skipped where an extra is missing."""
    return [pytest.param(name, marks=_marks(name)) for name in names]


def _marks(case: str) -> list[pytest.MarkDecorator]:
    if CASES[case][0]["model"] in detr.MODELS and find_spec("transformers") is None:
        return [pytest.mark.skip(reason="needs the transformers extra")]
    return []


def write_job(root: Path, body: dict[str, Any]) -> Path:
    """The case's job file under `root`: 2 ranks' worth of settings every case shares."""
    job = {"name": "job", **body}
    job["data"] = {**body["data"], "workers": 1}
    job["train"] = {**body["train"], "deterministic": True, "seed": 7, "log_every": 2}
    job["checkpoint"] = {**body["checkpoint"], "keep_last": 100}
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


def train_uninterrupted(case: str, root: Path) -> tuple[Path, Path]:
    """Train the case's job to its end under `root`: (its job file, its run directory)."""
    job = write_job(root, CASES[case][0])
    code, out = train(str(job), "--nproc", "2", "--out", str(root / "full"), "--no-check")
    assert code == 0, out
    return job, root / "full" / "job"


def check_stop_and_resume(case: str, job: Path, full: Path, root: Path) -> None:
    """Stop the job at each of the case's steps and resume it to the end: every common checkpoint
    of the cut run and the uninterrupted one `full` must be bitwise the same."""
    stops = CASES[case][1]
    total = json.loads((full / "summary.json").read_text())["steps"]
    assert stops[-1] < total, f"stops {stops} must end before the last step {total}"
    t0 = time.perf_counter()
    for i, k in enumerate(stops):
        resume = ["--resume"] if i else []
        code, out = train(str(job), "--nproc", "2", "--out", str(root / "cut"), "--no-check", "--max-steps",
                          str(k), *resume)
        assert code == 0, out
    code, out = train(str(job), "--nproc", "2", "--out", str(root / "cut"), "--no-check", "--resume")
    assert code == 0, out
    print(f"{case}: {len(stops) + 1} stopped/resumed runs in {time.perf_counter() - t0:.1f}s")
    cut = committed_steps(root / "cut" / "job")
    assert set(stops) | {total} <= set(cut), f"checkpoints {sorted(cut)} miss a stop or the end"
    diffs = differences(full, root / "cut" / "job", tuple(stops))
    assert diffs == [], diffs


def trainer_state(ckpt_path: Path, stopped_here: bool = False) -> dict[str, Any]:
    """A checkpoint's state.json without what may differ between equal runs."""
    state = json.loads((ckpt_path / "state.json").read_text(encoding="utf-8"))
    state.get("last_eval", {}).pop("eval_s", None)  # wall time of the validation
    if stopped_here:  # a run stopped here validated its last weights (the uninterrupted one did not)
        state.pop("last_eval", None)
        state.pop("last_eval_step", None)
    return state


def differences(a_dir: Path, b_dir: Path, stops: tuple[int, ...] = ()) -> list[str]:
    """What differs between the checkpoints both runs committed (empty: bitwise the same)."""
    a, b = committed_steps(a_dir), committed_steps(b_dir)
    common = sorted(set(a) & set(b))
    assert common, f"no checkpoint step in common: {sorted(a)} vs {sorted(b)}"
    found = []
    for step in common:
        if not same_shards(a[step], b[step]):  # else every tensor DCP would read from them is bitwise the same
            ta, tb = every_tensor(a[step]), every_tensor(b[step])
            if set(ta) != set(tb):
                found.append(f"step {step}: tensor keys differ: {sorted(set(ta) ^ set(tb))[:5]}")
            found += [f"step {step}: {k}" for k in sorted(set(ta) & set(tb)) if not bitwise_equal(ta[k], tb[k])]
        if trainer_state(a[step].path, step in stops) != trainer_state(b[step].path, step in stops):
            found.append(f"step {step}: state.json differs")
    return found


def same_shards(a: Committed, b: Committed) -> bool:
    """Both checkpoints' shard files byte for byte, with the same index of what each holds where (DCP's .metadata
    but for its save ids and path): every tensor read from them is then bitwise the same, which reading them
    (DCP's unpickling of every record: ~2.5 s a 219 MB Faster R-CNN checkpoint) would only repeat. False: compare
    tensor by tensor."""
    from torch.distributed.checkpoint import FileSystemReader

    names = sorted(p.name for p in a.path.glob("*.distcp"))
    if not names or names != sorted(p.name for p in b.path.glob("*.distcp")):
        return False
    ma, mb = FileSystemReader(str(a.path)).read_metadata(), FileSystemReader(str(b.path)).read_metadata()
    if (ma.state_dict_metadata, ma.storage_data, ma.planner_data) != (mb.state_dict_metadata, mb.storage_data,
                                                                      mb.planner_data):
        return False
    return all(filecmp.cmp(a.path / n, b.path / n, shallow=False) for n in names)
