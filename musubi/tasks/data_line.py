"""A job's data in words, for the dry run, the rank-0 console and summary.json: a synthetic set, splits on disk,
or a user task's own data (its sizes when it tells them, else who provides it). Torch is imported only to ask a
user task its sizes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from musubi.config.job import JobSpec


def task_sizes(spec: JobSpec) -> dict[str, int] | None:
    """A user task's own `data_sizes()` (builds the task: imports torch and the user's module)."""
    from musubi.tasks.registry import build_task

    sizes = build_task(spec).data_sizes()
    return {str(k): int(v) for k, v in sizes.items()} if sizes else None


def describe_data(spec: JobSpec, sizes: Mapping[str, int] | None = None) -> str:
    """'synthetic: 512 train / 64 val samples', 'train data/train; val data/val', or a user task's own data:
    'the task's own (pkg.mod:make): 4096 train / 1024 val samples' or 'provided by task pkg.mod:make'.
    `sizes`: counted samples per split (the ranks count them); unset, a user task is asked (task_sizes)."""
    d = spec.data
    if d.synthetic is not None:
        s = d.synthetic
        return f"synthetic: {s.train_size} train / {s.val_size} val samples"
    if d.train is not None:
        return f"train {d.train.path}; val {d.val.path if d.val else '-'}"
    if sizes is None:
        sizes = task_sizes(spec)
    if not sizes:
        return f"provided by task {spec.task}"
    counts = " / ".join(f"{n} {split}" for split, n in sizes.items())
    return f"the task's own ({spec.task}): {counts} samples"


def data_record(spec: JobSpec, train: int | None, val: int | None) -> dict[str, Any]:
    """summary.json's `data`: where the samples came from and how many each split had (as the ranks counted)."""
    source = "synthetic" if spec.data.synthetic is not None else "files" if spec.data.train is not None else "task"
    counted = {k: v for k, v in (("train", train), ("val", val)) if v is not None}
    return {"source": source, **counted, "said": describe_data(spec, counted if source == "task" else None)}
