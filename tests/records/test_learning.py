"""'Did it learn': the validation metric decides where it can, the training loss where not (records/learning.py).

On recorded metrics: the model zoo's run on 4x H200 (bench/results/zoo-2026-11-26-4xH200-7b6de92-run.tgz),
whose Faster R-CNN the loss rule called "not learning" at mAP50 0.60, and figures of runs BENCHMARKS.md records.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from musubi.records.checklist import build_checklist, learning_verdict
from musubi.records.learning import judge, lower_is_better, untrained_level

REPO = Path(__file__).resolve().parents[2]
ZOO = REPO / "bench" / "results" / "zoo-2026-11-26-4xH200-7b6de92-run.tgz"


def _records(train: list[tuple[int, float]], val: list[dict[str, Any]]) -> tuple[list[dict], list[float]]:
    return [{"kind": "val", **v} for v in val], [loss for _, loss in train]


def test_a_faster_rcnn_whose_loss_climbs_while_its_map_rises_learned() -> None:
    """The zoo's Faster R-CNN's first 12 logged losses (4x H200, 2026-11-26: 1.51 -> 0.86 -> 1.19) with the
    mAP50 rise of frcnn-320-ddp's validations (0.15 -> 0.41, BENCHMARKS.md). The loss alone says 'not
    learning'; the metric decides."""
    losses = [1.509, 0.894, 0.865, 0.943, 1.051, 1.181, 1.105, 1.128, 1.224, 1.194, 1.188, 1.175]
    vals = [{"step": 8, "map50": 0.15, "map": 0.05}, {"step": 16, "map50": 0.33}, {"step": 24, "map50": 0.41}]
    v = judge("map50", vals, losses)
    assert (v.learned, v.basis) == (True, "metric")
    assert v.found == "learned: map50 0.15 at step 8 -> 0.41 at step 24 over 3 validations"
    assert judge(None, [], losses).learned is False  # what the loss alone says


def test_a_metric_that_stays_at_zero_did_not_learn_whatever_the_loss_did() -> None:
    """The CPU rehearsal's DETR/EfficientDet jobs: 3 steps, loss falling, mAP50 0: the loss rule said PASS."""
    v = judge("map50", [{"step": 3, "map50": 0.0}], [60.3, 48.1, 41.0])
    assert (v.learned, v.basis) == (False, "metric") and "below 0.1" in v.found
    # 0.0004: the demo's SSDlite and external job that had learned nothing (2026-11-26)
    assert judge("map50", [{"step": 1, "map50": 0.01}, {"step": 2, "map50": 0.0004}], [2.0, 1.0]).learned is False


@pytest.mark.parametrize("vals, learned, says", [
    # flat after learning before its first validation: the level decides
    ([(100, 0.60), (200, 0.61), (300, 0.60)], True, "past 0.1"),
    # rising but still low: the trajectory decides
    ([(100, 0.02), (200, 0.05)], True, "over 2 validations"),
    # falling from a good level to below the floor: not learned
    ([(100, 0.30), (200, 0.05)], False, "below 0.1"),
])
def test_trajectory_then_level(vals: list[tuple[int, float]], learned: bool, says: str) -> None:
    v = judge("map50", [{"step": s, "map50": m} for s, m in vals], [1.0, 1.0])
    assert v.learned is learned and says in v.found, v.found


def test_top1_against_chance_needs_the_number_of_classes() -> None:
    """The README's synthetic classifier ended at top1 0.094-0.109 on 10 classes (chance) with its loss falling."""
    one = [{"step": 40, "top1": 0.109, "val_loss": 5709.0}]
    v = judge("top1", one, [2.4, 2.3, 2.2], num_classes=10)
    assert v.learned is False and "below 0.19" in v.found and "untrained model's 0.1" in v.found
    assert judge("top1", [{"step": 40, "top1": 0.95}], [2.4, 2.2], num_classes=10).learned is True
    # Classes unknown and one validation: no level, no trajectory: the loss, said as such
    v = judge("top1", one, [2.4, 2.3, 2.2])
    assert (v.learned, v.basis) == (True, "loss") and "at one validation only" in v.found
    assert untrained_level("top5", 3) == 1.0 and untrained_level("map_small", None) == 0.0
    assert untrained_level("val_acc", None) is None


def test_a_loss_like_metric_must_fall() -> None:
    assert lower_is_better("val_loss") and lower_is_better("val_ppl") and not lower_is_better("top1")
    assert judge("val_loss", [{"step": 1, "val_loss": 2.0}, {"step": 2, "val_loss": 1.5}], []).learned is True
    v = judge("val_loss", [{"step": 1, "val_loss": 2.0}, {"step": 2, "val_loss": 1.995}], [3.0, 1.0])
    assert (v.learned, v.basis) == (False, "metric") and "gain under 1%" in v.found


def test_no_metric_and_too_few_losses_is_no_verdict() -> None:
    v = judge(None, [], [1.0])
    assert v.learned is None and v.basis == "none"
    assert judge("map50", [{"step": 1, "map50": -1.0}], [1.0]).learned is None  # COCO's -1: no ground truth


def test_the_recorded_zoo_run_every_job_learned_by_its_map50(tmp_path: Path) -> None:
    """The 4x H200 zoo run: the Faster R-CNN's loss rose 1.11 -> 1.42 (first third -> last third) at mAP50 0.60;
    the checklist warned 'loss not falling' and bench/zoo.py said DID NOT LEARN. Judged by mAP50 now."""
    with tarfile.open(ZOO) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith("zoo/run/")
                   and Path(m.name).name in ("fleet.json", "run.json", "job.json", "metrics.jsonl", "eval.json")]
        tar.extractall(tmp_path, members=members, filter="data")
    run = tmp_path / "zoo" / "run"
    cl = build_checklist(run)
    items = {(i.job, i.check): i for i in cl.items}
    jobs = json.loads((run / "fleet.json").read_text())["jobs"]
    assert len(jobs) == 4
    for job in jobs:
        learned = items[(job, "learned")]
        assert learned.status == "PASS" and "map50" in learned.found, learned
        assert items[(job, "loss")].status == "PASS", items[(job, "loss")]
    frcnn = items[("frcnn-mbv3-rgb", "loss")].found
    assert "not falling" in frcnn and "judged by the validation metric" in frcnn
    assert learning_verdict(run / "frcnn-mbv3-rgb").found.startswith("learned: map50 0.6021")


def test_the_recorded_cpu_rehearsal_did_not_learn_in_three_steps(tmp_path: Path) -> None:
    """`python bench/zoo.py OUT --small --device cpu` on this 2-core machine (2026-11-28, 3 steps a job; its small
    files in tests/records/data): every job's mAP50 0; RT-DETR's, D-FINE's and the Faster R-CNN's losses fell,
    so the loss rule called them learning, the opposite of the metric. Judged by mAP50 now, all four did not."""
    with tarfile.open(Path(__file__).with_name("data") / "zoo-small-cpu-2026-11-28.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    run = tmp_path / "run"
    items = {(i.job, i.check): i for i in build_checklist(run).items}
    falling = [job for (job, check), i in items.items() if check == "loss" and "and falling" in i.found]
    assert sorted(falling) == ["dfine-n-thermal", "frcnn-mbv3-rgb", "rtdetr-r18-rgb"]
    learned = {job: i for (job, check), i in items.items() if check == "learned"}
    assert len(learned) == 4
    assert all(i.status == "WARN" and i.found.startswith("did not learn: map50 0 ") for i in learned.values())
    # the loss parts of a DETR-family detector were logged beside the total
    first = json.loads((run / "dfine-n-thermal" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"loss_vfl", "loss_bbox", "loss_giou"} <= set(first)
