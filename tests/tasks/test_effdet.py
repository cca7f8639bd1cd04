"""EfficientDet from effdet (the timm family): presets, training, pixel boxes, mAP, ONNX export, resume, refusals.

A tiny config (a 0.3 M-parameter timm MobileNetV3 backbone, 3 pyramid levels, 64-pixel images) keeps each in-process
case to a second or two on a CPU; one launch pair on 2 gloo ranks checks the bitwise resume.
"""

from __future__ import annotations

import json
import math
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.tasks import efficientdet
from musubi.tasks.detection import DetectionTask
from musubi.tasks.stem import adapt_stem
from tests.evaluate.jobs import make_task_job
from tests.tasks.missing_extra import hide_package

if find_spec("effdet") is None:
    pytest.skip("needs the effdet extra: pip install 'musubi-train[effdet]'", allow_module_level=True)

#: timm's smallest MobileNetV3 behind a 16-channel, one-cell BiFPN over 3 levels (strides 8-32): 64-pixel images.
TINY: dict[str, Any] = {"backbone_name": "mobilenetv3_small_050", "max_level": 5, "fpn_channels": 16,
                        "fpn_cell_repeats": 1, "box_class_repeats": 1}


def _config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "effdet", "task": "detection", "model": "efficientdet_d0", "model_args": dict(TINY),
        "data": {"synthetic": {"image_size": 64, "num_classes": 2, "objects": 2, "min_object": 12, "max_object": 32,
                               "train_size": 8, "val_size": 4}, "workers": 0},
    }
    config.update(overrides)
    return config


def _spec(**overrides: Any) -> JobSpec:
    return JobSpec(**_config(**overrides))


def test_presets_match_published_sizes() -> None:
    """Every named size builds (on meta tensors, pretrained_backbone=False: nothing fetched) with effdet's
    published parameter count (90 COCO classes) and its input side."""
    published_m = {"efficientdet_d0": (3.9, 512), "efficientdet_d1": (6.6, 640), "efficientdet_d2": (8.1, 768),
                   "efficientdet_d3": (12.0, 896)}
    assert set(published_m) == efficientdet.MODELS
    for name, (millions, side) in published_m.items():
        with torch.device("meta"):
            model = efficientdet.build_detector(name, 90, {}, None)
        count = sum(p.numel() for p in model.parameters()) / 1e6
        assert count == pytest.approx(millions, abs=0.1), name
        assert model.image_size == side and model.bench.anchors.boxes.shape[-1] == 4


def test_loss_falls_then_predicts_pixel_boxes() -> None:
    """A few AdamW steps lower effdet's loss (its two terms sum to DetBenchTrain's); eval gives NMS'd boxes in
    each image's pixels, clipped to it, labels 1..K; one-channel frames take the adapted stem."""
    torch.manual_seed(0)
    task = DetectionTask(_spec())
    task.validate()
    net = task.build_model().train()
    data = task.train_dataset()
    batch = task.to_device(task.collate([data[i] for i in range(4)]), torch.device("cpu"))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    losses = []
    for _ in range(6):
        loss, parts = task.loss(net, batch)
        assert set(parts) == {"loss_class", "loss_box"}
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0], losses
    images, targets = batch
    labels = {"bbox": [net._label(im, t)[0] for im, t in zip(images, targets, strict=True)],
              "cls": [t["labels"].float() for t in targets]}
    torch.manual_seed(1)  # the backbone's stochastic depth draws from it
    loss, _ = task.loss(net, batch)
    torch.manual_seed(1)
    assert float(net.bench(net._pixels(images), labels)["loss"].detach()) == pytest.approx(float(loss.detach()), rel=1e-6)
    net.eval()
    wide = torch.nn.functional.interpolate(images[0][None], size=(64, 128), mode="nearest")[0]
    with torch.no_grad():
        out = task.predict(net, (images, targets))
        a, b = net([images[0], wide])  # the same picture stretched 2x wide: x doubles, y stays
    assert len(out) == 4 and 0 < out[0]["boxes"].shape[0] <= 100
    assert set(out[0]["labels"].tolist()) <= {1, 2}  # Musubi's labels: 1..K, 0 is background
    assert bool((out[0]["scores"][:-1] >= out[0]["scores"][1:]).all())
    assert float(out[0]["boxes"].min()) >= 0 and float(out[0]["boxes"].max()) <= 64
    assert torch.allclose(b["boxes"] / torch.tensor([2.0, 1.0, 2.0, 1.0]), a["boxes"], atol=1e-3)
    metric = task.make_metric(torch.device("cpu"))
    metric.update(out, batch)
    assert 0.0 <= metric.compute(lambda t: t)["map50"] <= 1.0
    # Thermal frames (data.channels: 1, one_channel: stem): timm's stem conv takes the one channel; the adapted
    # model answers a grey frame as the RGB model (no ImageNet normalisation) answers it replicated.
    net.normalize = False
    grey = torch.rand(1, 64, 64)
    with torch.no_grad():
        rgb = net.bench.model(grey.expand(3, -1, -1)[None])
        assert adapt_stem(net) == "bench.model.backbone.conv_stem"
        one = net.bench.model(grey[None])
    for x, y in zip([*rgb[0], *rgb[1]], [*one[0], *one[1]], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


def test_batch_auto_probe_runs_effdet_steps() -> None:
    """`batch: auto`'s probe (in process, 1 rank) runs real AdamW steps of the EfficientDet at growing batches
    and stops below a simulated memory limit of 6 samples. The coordinated OOM restart around it is the
    model-agnostic runtime's, tested on 2 ranks with torchvision's and transformers' detectors."""
    from musubi.contract.inject import Injector
    from musubi.contract.world import World
    from musubi.worker.autobatch import probe_batch

    torch.manual_seed(0)
    task = DetectionTask(_spec())
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    result = probe_batch(task, world, "fp32", lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), 0.1,
                         Injector("oom_above:rank=0,batch=6", 0, None), cap=16)
    assert result.local_batch == 6 and result.batch == 6, result
    assert [t["batch"] for t in result.trials if t["fits"]] == [2, 4, 6]


def test_bad_model_args_and_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """One-line refusals: unknown or reserved model_args, an image side the pyramid cannot take, a backbone
    timm does not know; and, without effdet, a job naming an EfficientDet names the extra."""
    with pytest.raises(ConfigError, match="takes no fpn_channelz") as info:
        DetectionTask(_spec(model_args={**TINY, "fpn_channelz": 8})).validate()
    assert "\n" not in str(info.value) and "box_class_repeats" in str(info.value)
    for reserved in ("num_classes", "url", "backbone_pretrained", "backbone_checkpoint_path"):
        with pytest.raises(ConfigError, match=f"takes no {reserved}"):
            DetectionTask(_spec(model_args={**TINY, reserved: "x"})).validate()
    with pytest.raises(ConfigError, match=r"image side 64 is not a multiple of 128 \(2\^max_level\)"):
        DetectionTask(_spec(model_args={**TINY, "max_level": 7})).validate()
    DetectionTask(_spec(model_args={**TINY, "backbone_drop_path_rate": 0.0})).validate()  # a timm argument
    with pytest.raises(ConfigError, match="cannot be built from them.*no_such_net"):
        DetectionTask(_spec(model_args={**TINY, "backbone_name": "no_such_net"})).validate()

    hide_package(monkeypatch, efficientdet, "effdet")
    with pytest.raises(ConfigError) as info:
        DetectionTask(_spec()).validate()
    assert str(info.value) == ("model efficientdet_d0: needs effdet (EfficientDet, with timm): "
                               "pip install 'musubi-train[effdet]'")
    with pytest.raises(ConfigError, match=r"musubi-train\[effdet\]"):
        DetectionTask(_spec(model="efficientdet_d2")).build_model()


def test_onnx_export_with_parity(tmp_path: Path) -> None:
    """The trained detector exports (TorchScript exporter) with effdet's NMS in the graph, and ONNX Runtime
    agrees with torch on real images."""
    pytest.importorskip("onnxruntime")
    from musubi.evaluate.onnx_export import export_job

    job_dir = make_task_job(tmp_path, _config(), steps=2)
    record = export_job(job_dir)
    assert record["parity"]["ok"], record["parity"]
    assert record["exporter"] == "torchscript" and (job_dir / "export" / "model.onnx").is_file()
    assert record["parity"]["matched"] > 0 and record["input_info"]["size"] == [64, 64]
    assert "mean=" in record["input_info"]["normalisation"]
    with pytest.raises(ConfigError, match="torch.export cannot trace efficientdet_d0's post-processing"):
        export_job(job_dir, exporter="dynamo")  # refused in one line, before a minute of tracing


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_is_bitwise_on_two_ranks(tmp_path: Path) -> None:
    """DDP on 2 gloo ranks, stopped after step 2 and resumed == never stopped: every tensor of every checkpoint
    both runs hold (weights, BatchNorm buffers, effdet's anchors, AdamW state, each rank's RNG, which the
    backbone's stochastic depth draws from), bitwise; then validation's mAP through the task's evaluator.

    One launch pair, not the resume matrix's three: the uninterrupted run's own step-2 checkpoint is the
    stop (its later checkpoints removed), so the second launch resumes from exactly what a stop would leave.
    """
    import shutil

    from tests.support.runs import bitwise_equal, committed_steps, every_tensor, train

    job = _config(name="job")
    job["data"] = {**job["data"], "workers": 1}
    job["data"]["synthetic"].update(train_size=16)
    job["train"] = {"epochs": 1, "batch": 2, "optimizer": "adamw", "lr": 0.001, "base_batch": 4,
                    "warmup_steps": 1, "grad_clip": 10.0, "deterministic": True, "seed": 7, "log_every": 2}
    job["checkpoint"] = {"every_steps": 2, "keep_last": 100}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    code, out = train(str(path), "--nproc", "2", "--out", str(tmp_path / "full"), "--no-check")
    assert code == 0, out
    full = committed_steps(tmp_path / "full" / "job")
    assert sorted(full) == [2, 4], sorted(full)  # 16 images / (2 ranks x 2) = 4 steps
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    cut_dir = tmp_path / "cut" / "job"
    shutil.rmtree(cut_dir / "checkpoints" / full[4].path.name)
    for name in ("summary.json", "eval.json"):
        (cut_dir / name).unlink()
    record = json.loads((cut_dir / "job.json").read_text())
    (cut_dir / "job.json").write_text(json.dumps({**record, "status": "stopped"}))  # as `--max-steps 2` leaves it
    assert sorted(committed_steps(cut_dir)) == [2]
    code, out = train(str(path), "--nproc", "2", "--out", str(tmp_path / "cut"), "--no-check", "--resume")
    assert code == 0, out
    assert "resumed from step-000000002" in (cut_dir / "logs" / "rank0.log").read_text(), out
    cut = committed_steps(cut_dir)
    for step in (2, 4):
        a, b = every_tensor(full[step]), every_tensor(cut[step])
        assert set(a) == set(b) and any("anchors" in k for k in a)
        assert [k for k in a if not bitwise_equal(a[k], b[k])] == [], step
    metrics = json.loads((cut_dir / "eval.json").read_text())["metrics"]
    assert metrics["map50"] == json.loads((tmp_path / "full" / "job" / "eval.json").read_text())["metrics"]["map50"]
