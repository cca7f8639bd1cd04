"""DETR-family detectors (transformers' RT-DETR v1/v2, D-FINE): presets, training, mAP, ONNX export, refusals.

Tiny configs (a few hundred thousand parameters, 64-pixel images) keep each case to seconds on a CPU.
The distributed bitwise resume of these models is tests/checkpoint/resume_matrix/ (test_resume_rtdetr.py, test_resume_dfine.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.tasks import detr
from musubi.tasks.detection import DetectionTask
from musubi.tasks.stem import adapt_stem
from tests.evaluate.jobs import make_task_job
from tests.tasks.detr_tiny import TINY_DFINE, TINY_RTDETR
from tests.tasks.missing_extra import hide_package

pytest.importorskip("transformers")
pytest.importorskip("scipy")

TINY = {"rtdetr_r18": TINY_RTDETR, "rtdetr_v2_r18": TINY_RTDETR, "dfine_s": TINY_DFINE}


def _config(model: str, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "detr", "task": "detection", "model": model, "model_args": dict(TINY[model]),
        "data": {"synthetic": {"image_size": 64, "num_classes": 2, "objects": 2, "min_object": 12, "max_object": 32,
                               "train_size": 8, "val_size": 4}, "workers": 0},
    }
    config.update(overrides)
    return config


def _spec(model: str = "rtdetr_r18", **overrides: Any) -> JobSpec:
    return JobSpec(**_config(model, **overrides))


def test_presets_match_published_sizes() -> None:
    """Every named size builds (on meta tensors) with the parameter count of its paper, to within 1 M."""
    published_m = {"rtdetr_r18": 20, "rtdetr_r34": 31, "rtdetr_r50": 42, "rtdetr_r101": 76, "rtdetr_v2_r18": 20,
                   "rtdetr_v2_r50": 42, "dfine_n": 4, "dfine_s": 10, "dfine_m": 19, "dfine_l": 31, "dfine_x": 62}
    assert set(published_m) <= detr.MODELS
    for name, millions in published_m.items():
        with torch.device("meta"):
            model = detr.build_detector(name, 80, {}, None)
        count = sum(p.numel() for p in model.parameters()) / 1e6
        assert count == pytest.approx(millions, abs=1.0), name
        assert model.image_size == detr.DEFAULT_IMAGE_SIZE


@pytest.mark.parametrize("model", sorted(TINY))
def test_loss_falls_then_predicts_pixel_boxes(model: str) -> None:
    """A few AdamW steps on one synthetic batch lower transformers' loss; eval gives top-k boxes in pixels."""
    torch.manual_seed(0)
    task = DetectionTask(_spec(model))
    task.validate()
    net = task.build_model().train()
    data = task.train_dataset()
    batch = task.to_device(task.collate([data[i] for i in range(4)]), torch.device("cpu"))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    losses = []
    for _ in range(8):
        loss, parts = task.loss(net, batch)
        assert {"loss_vfl", "loss_bbox", "loss_giou"} <= set(parts)
        assert not any(p.requires_grad for p in parts.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0], losses
    net.eval()
    with torch.no_grad():
        out = task.predict(net, batch)
    keep = min(detr.DEFAULT_MAX_DETECTIONS, 20 * 2)  # queries x classes
    assert len(out) == 4 and out[0]["boxes"].shape == (keep, 4)
    assert set(out[0]["labels"].tolist()) <= {1, 2}  # Musubi's labels: 1..K, 0 is background
    assert bool((out[0]["scores"][:-1] >= out[0]["scores"][1:]).all())
    metric = task.make_metric(torch.device("cpu"))
    metric.update(out, batch)
    result = metric.compute(lambda t: t)
    assert 0.0 <= result["map50"] <= 1.0


def test_boxes_scale_to_each_image() -> None:
    """An image of another size is resized for the model and its boxes come back in its own pixels."""
    torch.manual_seed(0)
    net = detr.build_detector("rtdetr_r18", 2, TINY_RTDETR, 64).eval()
    small = torch.rand(3, 64, 64)
    wide = torch.nn.functional.interpolate(small[None], size=(64, 128), mode="nearest")[0]
    with torch.no_grad():
        a, b = net([small, wide])  # nearest 2x then bilinear back: the model sees the same pixels
    assert torch.allclose(a["scores"], b["scores"], atol=1e-5)
    # Same picture stretched 2x wide: x doubles, y stays (rows sorted: tied scores may order either way).
    def rows(boxes: torch.Tensor) -> torch.Tensor:
        return torch.tensor(sorted(boxes.round(decimals=2).tolist()))
    assert torch.allclose(rows(b["boxes"] / torch.tensor([2.0, 1.0, 2.0, 1.0])), rows(a["boxes"]), atol=0.05)


def test_detections_stay_on_the_outputs_device() -> None:
    """Post-processing makes no tensor on the CPU beside the model's outputs: on 2x H200 the first validation
    failed with 'found at least two devices, cuda:0 and cpu' (the image sizes were CPU tensors). The meta
    device refuses the same mix on a machine without a GPU."""
    net = detr.build_detector("rtdetr_r18", 2, TINY_RTDETR, 64)
    logits, boxes = torch.zeros(2, 300, 2, device="meta"), torch.zeros(2, 300, 4, device="meta")
    images = [torch.zeros(3, 64, 64, device="meta"), torch.zeros(3, 64, 96, device="meta")]
    out = net._detections(logits, boxes, images)
    assert [d["boxes"].device.type for d in out] == ["meta", "meta"]


@pytest.mark.parametrize("model", ["rtdetr_r18", "dfine_s"])
def test_one_channel_stem_equals_rgb_model_on_replicated_grey(model: str) -> None:
    """Thermal frames with data.one_channel: stem (the default): transformers' backbones check the input's
    channels against their own count, which follows the adapted convolution (a worker failed at its first
    step before); the adapted model answers a grey frame as the RGB model answers it replicated."""
    torch.manual_seed(0)
    net = detr.build_detector(model, 2, TINY[model], 64).eval()
    grey = torch.rand(1, 1, 64, 64)
    with torch.no_grad():
        rgb = net.model(pixel_values=grey.expand(-1, 3, -1, -1))
        adapt_stem(net)
        one = net.model(pixel_values=grey)
    torch.testing.assert_close(one.logits, rgb.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(one.pred_boxes, rgb.pred_boxes, rtol=1e-4, atol=1e-4)


def test_bad_model_args_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="takes no decoder_layerz") as info:
        DetectionTask(_spec(model_args={**TINY_RTDETR, "decoder_layerz": 2})).validate()
    assert "\n" not in str(info.value) and "backbone_depths" in str(info.value)
    with pytest.raises(ConfigError, match="model_args.backbone_depths: 'one' is not a comma-separated list of int"):
        DetectionTask(_spec(model_args={**TINY_RTDETR, "backbone_depths": "one"})).validate()
    with pytest.raises(ConfigError, match="not a multiple of 32"):
        DetectionTask(_spec(model_args={**TINY_RTDETR, "image_size": 100})).validate()
    with pytest.raises(ConfigError, match="num_queries 500 exceeds the 84 feature positions"):
        DetectionTask(_spec(model_args={**TINY_RTDETR, "num_queries": 500})).validate()
    for reserved in ("num_labels", "use_pretrained_backbone", "use_focal_loss"):
        with pytest.raises(ConfigError, match=f"takes no {reserved}"):
            DetectionTask(_spec(model_args={**TINY_RTDETR, reserved: 3})).validate()


def test_missing_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without transformers, a job naming a DETR model is refused in one line naming the extra."""
    hide_package(monkeypatch, detr, "transformers")
    with pytest.raises(ConfigError) as info:
        DetectionTask(_spec("dfine_s")).validate()
    assert str(info.value) == ("model dfine_s: needs Hugging Face transformers and scipy: "
                               "pip install 'musubi-train[transformers]'")
    with pytest.raises(ConfigError, match=r"musubi-train\[transformers\]"):
        DetectionTask(_spec("rtdetr_r18")).build_model()
    DetectionTask(JobSpec(**{**_config("rtdetr_r18"), "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
                             "model_args": {}})).validate()  # torchvision models need no extra


def test_weights_file_round_trip(tmp_path: Path) -> None:
    """A local state dict starts the model (strictly); nothing is ever fetched from a hub."""
    torch.manual_seed(0)
    model = DetectionTask(_spec()).build_model()
    path = tmp_path / "w.pt"
    torch.save(model.state_dict(), path)
    loaded = DetectionTask(_spec(weights=str(path))).build_model()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values(),
                                                 strict=True))
    with pytest.raises(ConfigError, match="shape mismatch"):
        DetectionTask(_spec(weights=str(path), model_args={**TINY_RTDETR, "d_model": 64})).validate()


@pytest.mark.parametrize("model", ["rtdetr_r18", "dfine_s"])
def test_onnx_export_with_parity(tmp_path: Path, model: str) -> None:
    """The trained detector exports (TorchScript exporter) and ONNX Runtime agrees with torch on real images."""
    pytest.importorskip("onnxruntime")
    from musubi.evaluate.onnx_export import export_job

    job_dir = make_task_job(tmp_path, _config(model), steps=2)
    record = export_job(job_dir)
    assert record["parity"]["ok"], record["parity"]
    assert record["exporter"] == "torchscript" and (job_dir / "export" / "model.onnx").is_file()
    assert record["parity"]["matched"] > 0 and record["input_info"]["size"] == [64, 64]
    assert "no normalisation" in record["input_info"]["normalisation"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_probe_and_oom_recovery_on_two_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`batch: auto` and the OOM guard with a DETR model (one launch, 2 gloo ranks): the probe's real
    forward+backward+optimizer steps agree on the smaller rank's simulated limit, then an OOM in rank 1's
    backward is recovered by a coordinated restart at half the micro-batch, twice the accumulation."""
    from tests.support.runs import train

    job = {**_config("rtdetr_r18"), "name": "probe"}
    job["data"]["synthetic"].update(train_size=32)
    job["train"] = {"batch": "auto", "min_batch": 2, "epochs": 1, "optimizer": "adamw", "lr": 0.001,
                    "base_batch": 8, "grad_clip": 0.1, "log_every": 1}
    job["checkpoint"] = {"every_steps": 2}
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    monkeypatch.setenv("MUSUBI_INJECT", "oom_above:rank=0,batch=6; oom_above:rank=1,batch=4; "
                                        "oom:rank=1,step=3,phase=backward")
    code, out = train(str(path), "--nproc", "2", "--out", str(tmp_path / "r"), "--no-check")
    assert code == 0, out
    jd = tmp_path / "r" / "probe"
    probe = json.loads((jd / "memory" / "probe.json").read_text())
    assert probe["local_batch"] == 6  # rank 0's own answer; the agreed one is rank 1's
    batch = json.loads((jd / "memory" / "batch.json").read_text())
    assert (batch["per_rank"], batch["accumulation"], batch["global_batch"]) == (2, 2, 8)
    assert batch["history"][0] == "batch: auto probed/cached 4 per rank (probe)"
    assert "OOM on rank 1 in backward at step 3: per-rank batch 4 -> 2" in batch["history"][1]
    summary = json.loads((jd / "summary.json").read_text())
    assert summary["finished"] and summary["restarts"] == 1 and summary["steps"] == 4
    assert summary["batch_source"] == "oom-recovery"
    assert "map50" in json.loads((jd / "eval.json").read_text())["metrics"]
