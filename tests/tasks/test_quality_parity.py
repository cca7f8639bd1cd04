"""bench/quality.py compares like with like: the plain loop (bench/plain_quality_loop.py) and Musubi build the same
model with bit-identical initial weights from the same seed, compute the same DETR losses (RT-DETR, D-FINE),
follow the same LR schedule, and the plain loop imports nothing of Musubi."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import plain_quality_loop as plain
from bench import quality
from musubi.config.job import JobSpec
from musubi.tasks.registry import build_task
from musubi.worker.schedule import lr_factor
from musubi.worker.trainer import seed_everything
from tests.conftest import REPO

data = quality.quality_data
SIDE = 96  # small scenes; RT-DETR needs a multiple of 32 and >= 100 feature positions for its 100 queries


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cls/ and det/ written from fake 8x8 'digits' (all ten labels), as the bench lays them out."""
    root = tmp_path_factory.mktemp("quality")
    rng = np.random.default_rng(0)
    images = np.zeros((40, 8, 8), dtype=np.uint8)
    images[:, 1:7, 2:6] = rng.integers(60, 256, (40, 6, 4))
    labels = np.arange(40) % 10
    p = data.DataParams(canvas=SIDE, min_digit=16, max_digit=32)
    data.write_classification(root / "cls", images, labels, {"train": np.arange(30), "val": np.arange(30, 40)}, 32)
    data.coco_scenes(root / "det" / "train", images[:30], labels[:30], 4, seed=1, p=p)
    data.coco_scenes(root / "det" / "val", images[30:], labels[30:], 2, seed=2, p=p)
    return root


def _both(key: str, root: Path, seed: int):
    """(Musubi's task and model as a rank builds it, the plain loop's args and model), both from `seed`."""
    recipe = quality.RECIPES[key]
    if recipe.task == "detection":
        recipe = replace(recipe, image_size=SIDE)
    if recipe.model == "dfine_n":  # strides 16 and 32 only: 45 feature positions at 96 px to pick queries from
        recipe = replace(recipe, model_args={**recipe.model_args, "num_queries": 40})
    job = quality.musubi_job(recipe, quality.Run(key, "musubi", 1, seed), root, "fp32", 0, None)
    task = build_task(JobSpec.model_validate(job))
    task.validate()
    seed_everything(seed)  # as the Trainer does, just before task.build_model()
    musubi_model = task.build_model()
    argv = quality.plain_argv(recipe, quality.Run(key, "plain", 1, seed), root, "cpu", "fp32", 0, None,
                              root / "p.json")
    args = plain.get_args_parser().parse_args(argv[2:])
    num_classes = 10
    torch.manual_seed(args.seed)  # as the plain loop's main does
    plain_model = plain.build_model(args, num_classes)
    return task, musubi_model, args, plain_model


DETRS = ("detr", "dfine")  # RT-DETR r18, D-FINE-N


@pytest.fixture(scope="module")
def detr_pairs(sets: Path) -> dict:
    """Each DETR of both sides, built once (RT-DETR r18: 20 M parameters, seconds each)."""
    return {key: _both(key, sets, seed=5) for key in DETRS}


@pytest.mark.parametrize("key", ["classifier", "cnn_detector", *DETRS])
def test_both_sides_start_from_the_same_weights(key: str, sets: Path, detr_pairs: dict) -> None:
    _, musubi_model, _, plain_model = detr_pairs[key] if key in DETRS else _both(key, sets, seed=5)
    inner = getattr(musubi_model, "model", musubi_model)  # DetrDetector wraps the transformers model
    if key in DETRS:
        assert inner.config.to_dict() == plain_model.config.to_dict()
    ours, theirs = inner.state_dict(), plain_model.state_dict()
    assert list(ours) == list(theirs)
    different = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
    assert sum(v.numel() for v in ours.values()) > 1_000_000


@pytest.mark.parametrize("key", DETRS)
def test_detr_loss_is_the_same_on_both_sides(key: str, detr_pairs: dict) -> None:
    task, musubi_model, args, plain_model = detr_pairs[key]
    ds = plain.CocoBoxes(args.train, args.train_ann)
    samples = [ds[i] for i in range(2)]
    images = [s[0].float() / 255 for s in samples]
    targets = [{"boxes": s[1]["boxes"], "labels": s[1]["labels"]} for s in samples]
    torch.manual_seed(7)  # RT-DETR's denoising queries draw from torch's generator
    ours, _ = task.loss(musubi_model.train(), (images, targets))
    torch.manual_seed(7)
    theirs = plain.detection_loss(plain_model.train(), images, targets, args)
    assert torch.isfinite(ours) and ours.item() == pytest.approx(theirs.item(), rel=1e-6)


@pytest.mark.parametrize(("warmup", "total"), [(0, 50), (20, 330), (30, 400), (5, 3)])
def test_the_lr_schedule_is_musubis(warmup: int, total: int) -> None:
    ours, theirs = lr_factor(warmup, total, "cosine"), plain.lr_lambda(warmup, total)
    assert [ours(s) for s in range(total + 3)] == [theirs(s) for s in range(total + 3)]


def test_the_plain_loop_imports_nothing_of_musubi() -> None:
    tree = ast.parse((REPO / "bench" / "plain_quality_loop.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] in ("musubi", "bench")]
