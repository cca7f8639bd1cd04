"""Classification task: synthetic data, image folders, model lookup, weights, step and exact metrics."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
import torch
from PIL import Image

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.data import synthetic_classification as synth
from musubi.tasks.classification import ClassificationMetric, ClassificationTask


def make_job(**overrides: Any) -> JobSpec:
    """A tiny synthetic classification job (32 px; objects shrunk to satisfy SyntheticSpec)."""
    fields: dict[str, Any] = {
        "name": "cls",
        "task": "classification",
        "model": "resnet18",
        "data": {
            "synthetic": {
                "train_size": 16,
                "val_size": 8,
                "image_size": 32,
                "num_classes": 10,
                "min_object": 2,
                "max_object": 8,
            }
        },
    }
    fields.update(overrides)
    return JobSpec(**fields)


def folder_job(tmp_path, val: bool = True, **overrides: Any) -> JobSpec:
    data: dict[str, Any] = {"train": {"path": str(tmp_path / "train")}, "image_size": 16}
    if val:
        data["val"] = {"path": str(tmp_path / "val")}
    return make_job(data=data, **overrides)


def write_pngs(root, classes: dict[str, tuple[int, int, int]], per_class: int = 2) -> None:
    for name, colour in classes.items():
        d = root / name
        d.mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (20 + 7 * i, 24), colour).save(d / f"{i}.png")


# -- synthetic data ---------------------------------------------------------
def test_synthetic_is_deterministic_and_learnable() -> None:
    a = synth.SyntheticClassification(40, 16, 4, seed=7)
    b = synth.SyntheticClassification(40, 16, 4, seed=7)
    torch.manual_seed(1)
    x1, y1 = a[9]
    torch.manual_seed(2)
    x2, y2 = b[9]
    assert torch.equal(x1, x2) and y1 == y2 == 9 % 4
    assert x1.shape == (3, 16, 16) and x1.dtype == torch.float32
    assert not torch.equal(
        synth.SyntheticClassification(40, 16, 4, seed=7, stream=synth.VAL_STREAM)[9][0], x1
    )
    # Learnable: a nearest-class-mean classifier on the per-channel means is nearly perfect.
    feats = torch.stack([a[i][0].mean(dim=(1, 2)) for i in range(40)])  # [N,3]
    labels = torch.tensor([a[i][1] for i in range(40)])
    means = torch.stack([feats[labels == k].mean(0) for k in range(4)])  # [K,3]
    pred = torch.cdist(feats, means).argmin(1)
    assert (pred == labels).float().mean() > 0.9


def test_device_batch_on_cpu() -> None:
    task = ClassificationTask(make_job())
    g = torch.Generator().manual_seed(0)
    images, labels = task.device_batch(6, torch.device("cpu"), g)
    assert images.shape == (6, 3, 32, 32) and labels.shape == (6,)
    assert int(labels.max()) < 10
    g.manual_seed(0)
    assert torch.equal(task.device_batch(6, torch.device("cpu"), g)[0], images)


# -- image folders ------------------------------------------------------------
def test_image_folder_round_trip(tmp_path) -> None:
    write_pngs(tmp_path / "train", {"cat": (255, 0, 0), "dog": (0, 0, 255)})
    write_pngs(tmp_path / "val", {"dog": (0, 0, 255)}, per_class=1)  # a subset of the classes
    task = ClassificationTask(folder_job(tmp_path))
    task.validate()
    assert task.num_classes() == 2
    train = task.train_dataset()
    assert len(train) == 4
    image, label = train[0]
    assert image.shape == (3, 16, 16) and label == 0  # resized + centre-cropped, classes sorted
    assert image[0].mean() > image[2].mean()  # red cat, normalised
    assert torch.equal(train[0][0], train[0][0])  # deterministic transform
    val = task.val_dataset()
    assert val is not None and len(val) == 1
    assert val[0][1] == 1  # "dog" keeps the training split's index
    model = task.build_model()
    assert model.fc.out_features == 2


def test_image_folder_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        ClassificationTask(folder_job(tmp_path, val=False)).validate()
    write_pngs(tmp_path / "train", {"cat": (1, 2, 3)})
    (tmp_path / "train" / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty"):
        ClassificationTask(folder_job(tmp_path, val=False)).validate()
    (tmp_path / "train" / "empty").rmdir()
    (tmp_path / "val" / "cat").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds no images"):
        ClassificationTask(folder_job(tmp_path)).validate()
    write_pngs(tmp_path / "val", {"cow": (1, 2, 3)})
    with pytest.raises(ConfigError, match="not in data.train: cow"):
        ClassificationTask(folder_job(tmp_path)).validate()


# -- models -------------------------------------------------------------------
def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(ConfigError, match=r"did you mean .*resnet18") as e:
        ClassificationTask(make_job(model="resnet81")).validate()
    assert "\n" not in str(e.value)


def test_timm_model_without_timm(monkeypatch: pytest.MonkeyPatch) -> None:
    # `make test` installs timm (the effdet extra needs it): hide it, as on a machine without it
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` now raises ImportError
    with pytest.raises(ConfigError, match="pip install timm"):
        ClassificationTask(make_job(model="timm/resnet18")).validate()


def test_model_args_checked_before_workers() -> None:
    with pytest.raises(ConfigError, match="num_classes"):
        ClassificationTask(make_job(model_args={"num_classes": 3})).validate()
    with pytest.raises(ConfigError, match="rejects them"):
        ClassificationTask(make_job(model_args={"no_such_arg": 1})).validate()
    ClassificationTask(make_job(model_args={"zero_init_residual": True})).validate()
    # torchvision ViTs get the data's image size unless told otherwise.
    assert ClassificationTask(make_job(model="vit_b_16")).model_args()["image_size"] == 32


# -- weights ------------------------------------------------------------------
def test_weights_round_trip_and_mismatch(tmp_path) -> None:
    torch.manual_seed(0)
    source = ClassificationTask(make_job()).build_model()
    path = tmp_path / "w.pt"
    # A DDP-style checkpoint: wrapped in {"model": ...} with "module." prefixes.
    torch.save({"model": {f"module.{k}": v for k, v in source.state_dict().items()}}, path)
    task = ClassificationTask(make_job(weights=str(path)))
    task.validate()
    loaded = task.build_model()
    for (k, v), w in zip(source.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(v, w), k

    job5 = make_job(weights=str(path))
    job5.data.synthetic.num_classes = 5
    with pytest.raises(ConfigError, match=r"shape mismatch \(fc.weight file \[10, 512\] vs model \[5, 512\]"):
        ClassificationTask(job5).validate()
    with pytest.raises(ConfigError, match="does not fit"):
        ClassificationTask(job5).build_model()
    with pytest.raises(ConfigError, match="no such file"):
        ClassificationTask(make_job(weights=str(tmp_path / "nope.pt"))).validate()
    other = tmp_path / "other.pt"
    torch.save({"something": torch.zeros(1)}, other)
    with pytest.raises(ConfigError, match="missing"):
        ClassificationTask(make_job(weights=str(other))).validate()


# -- step ---------------------------------------------------------------------
def test_training_steps_are_finite_and_learn() -> None:
    torch.manual_seed(0)
    task = ClassificationTask(make_job())
    model = task.build_model()
    ds = task.train_dataset()
    batch = task.collate([ds[i] for i in range(8)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(4):
        loss, parts = task.loss(model, batch)
        assert loss.ndim == 0 and torch.isfinite(loss) and set(parts) == {"ce"}
        opt.zero_grad()
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(10), rel=0.5)  # chance level at init
    assert losses[-1] < losses[0]
    model.eval()
    with torch.no_grad():
        logits = task.predict(model, batch)
    assert logits.shape == (8, 10)
    assert task.batch_size_of(batch) == 8


# -- metric -------------------------------------------------------------------
def _fake_batches() -> list[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for n in (3, 5, 7):  # uneven batches: ranks may hold different numbers of samples
        logits = torch.randn(n, 6, generator=g)
        labels = torch.randint(6, (n,), generator=g)
        out.append((logits, (torch.zeros(n, 3, 2, 2), labels)))
    return out


def test_metric_exact_on_one_rank() -> None:
    batches = _fake_batches()
    m = ClassificationMetric(6, torch.device("cpu"))
    for logits, batch in batches:
        m.update(logits, batch)
    got = m.compute(lambda t: t)
    logits = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1][1] for b in batches])
    assert got["top1"] == pytest.approx((logits.argmax(1) == labels).double().mean().item(), abs=0)
    top5 = (logits.topk(5, 1).indices == labels[:, None]).any(1).double().mean().item()
    assert got["top5"] == pytest.approx(top5, abs=0)
    ce = torch.nn.functional.cross_entropy(logits.double(), labels).item()
    assert got["val_loss"] == pytest.approx(ce, rel=1e-6)


def test_metric_two_simulated_ranks_match_one() -> None:
    batches = _fake_batches()
    whole = ClassificationMetric(6, torch.device("cpu"))
    rank0 = ClassificationMetric(6, torch.device("cpu"))
    rank1 = ClassificationMetric(6, torch.device("cpu"))
    for i, (logits, batch) in enumerate(batches):
        whole.update(logits, batch)
        (rank0 if i == 0 else rank1).update(logits, batch)  # 3 samples vs 12

    def reduce_sum(t: torch.Tensor) -> torch.Tensor:
        return rank0.state + rank1.state  # what an all-reduce SUM over two ranks returns

    two = rank0.compute(reduce_sum)
    assert two == rank1.compute(reduce_sum)
    one = whole.compute(lambda t: t)
    assert two["top1"] == one["top1"] and two["top5"] == one["top5"]
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-12)
    # Averaging per-rank accuracies would be wrong with unequal counts: the sums are what's reduced.
    assert set(two) == {"top1", "top5", "val_loss"}


def test_metric_without_top5_for_few_classes() -> None:
    m = ClassificationMetric(3, torch.device("cpu"))
    m.update(torch.tensor([[2.0, 1.0, 0.0]]), (None, torch.tensor([0])))
    assert m.compute(lambda t: t) == {"top1": 1.0, "val_loss": pytest.approx(0.4076, abs=1e-4)}
    empty = ClassificationMetric(3, torch.device("cpu")).compute(lambda t: t)
    assert math.isnan(empty["top1"])
