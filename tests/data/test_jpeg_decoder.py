"""The JPEG decoder a rank chooses at start: hardware engines (nvImageCodec), nvJPEG on the SMs, or the host.

No GPU here: the choice and its fallbacks are tested with nvImageCodec missing, failing or faked (the
module's Python surface, as its 0.9 wheel has it); the engines' pixels are checked on the lent machine
(tests/gpu/test_jpeg_gpu.py).
"""

from __future__ import annotations

import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from musubi.config.job import JobSpec
from musubi.data import jpeg_decoder
from musubi.data.jpeg_decoder import CUDA, HARDWARE, HOST, captured_output, choose

from .sets import small_set

GPU = torch.device("cuda", 0)  # a device object only: nothing here touches CUDA


class FakeImage:
    """An nvImageCodec Image on the host side of the probe: .cpu() gives H x W x 3 uint8."""

    def __init__(self, pixels: np.ndarray) -> None:
        self.pixels = pixels

    def cpu(self) -> np.ndarray:
        return self.pixels


def fake_codec(monkeypatch: pytest.MonkeyPatch, *, opens: bool = True, decodes: bool = True,
               chatter: str = "") -> types.SimpleNamespace:
    """Install a stand-in `nvidia.nvimgcodec`: its Decoder may fail to open, refuse the probe, or decode it."""
    made: list[dict[str, Any]] = []

    class Decoder:
        def __init__(self, **kw: Any) -> None:
            if not opens:
                raise RuntimeError("CUDA Runtime failure: '#35' at device_utils.h:32\nmore")
            made.append(kw)

        def decode(self, streams: list[Any], params: Any = None, cuda_stream: int = 0) -> list[Any]:
            if not decodes:
                return [None] * len(streams)
            import io

            from PIL import Image

            return [FakeImage(np.asarray(Image.open(io.BytesIO(s.data.tobytes())).convert("RGB"))) for s in streams]

    mod = types.ModuleType("nvidia.nvimgcodec")
    mod.Decoder = Decoder
    mod.Backend = lambda kind: ("backend", kind)
    mod.BackendKind = types.SimpleNamespace(HW_GPU_ONLY="HW_GPU_ONLY")
    mod.DecodeParams = lambda **kw: kw
    mod.ColorSpec = types.SimpleNamespace(SRGB="SRGB")
    mod.SampleFormat = types.SimpleNamespace(I_RGB="I_RGB")
    mod.CodeStream = lambda data: types.SimpleNamespace(data=data)
    parent = types.ModuleType("nvidia")
    parent.nvimgcodec = mod
    monkeypatch.setitem(sys.modules, "nvidia", parent)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", mod)
    monkeypatch.setattr(jpeg_decoder, "import_nvimgcodec", lambda: (mod, chatter))
    return types.SimpleNamespace(module=mod, made=made)


def missing_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYNVIMGCODEC_VERBOSITY", "0")  # import_nvimgcodec sets it; restored after the test
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # `from nvidia import nvimgcodec` -> ImportError


def test_a_cpu_rank_decodes_on_the_host_whatever_is_asked(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert choose(torch.device("cpu"), "auto").name == HOST
        assert choose(torch.device("cpu"), "cuda").name == HOST
        assert not caplog.records
        got = choose(torch.device("cpu"), "hardware")
    assert got.name == HOST and got.hardware is None
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "hardware, but this rank runs on cpu" in warning.getMessage() and "\n" not in warning.getMessage()


def test_without_nvimgcodec_the_sms_decode_and_hardware_says_how_to_install(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    missing_codec(monkeypatch)
    with caplog.at_level(logging.INFO):
        auto = choose(GPU, "auto")
    assert auto.name == CUDA and auto.hardware is None and "not installed" in auto.why_not
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # auto: an info line, no warning
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        asked = choose(GPU, "hardware")
    assert asked.name == CUDA
    [warning] = caplog.records
    text = warning.getMessage()
    assert "pip install 'musubi-train[hwdecode]'" in text and CUDA in text and "\n" not in text


def test_engines_that_cannot_open_or_decode_fall_back_to_the_sms(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_codec(monkeypatch, opens=False)  # what nvImageCodec raises on a machine without a usable GPU
    got = choose(GPU, "auto")
    assert got.name == CUDA and "could not decode on cuda:0 (CUDA Runtime failure: '#35'" in got.why_not
    assert "\n" not in got.why_not
    fake_codec(monkeypatch, decodes=False)
    assert "no hardware JPEG engine" in choose(GPU, "auto").why_not
    fake_codec(monkeypatch, decodes=False, chatter="Failed to load nvjpeg library! Please install ...")
    assert "no libnvjpeg" in choose(GPU, "hardware").why_not


def test_engines_that_decode_the_probe_are_chosen_unless_cuda_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_codec(monkeypatch)
    got = choose(GPU, "auto")
    assert got.name == HARDWARE and got.hardware is not None and got.why_not == ""
    assert got.describe().startswith(HARDWARE) and CUDA in got.describe()  # and what they refuse goes there
    # Restricted to the hardware backend, on the rank's GPU, with few parsing threads; no EXIF rotation.
    [kw] = fake.made
    assert kw["backends"] == [("backend", "HW_GPU_ONLY")] and kw["device_id"] == 0 and kw["max_num_cpu_threads"] == 2
    assert got.hardware.params["apply_exif_orientation"] is False
    fake.made.clear()
    assert choose(GPU, "cuda").name == CUDA and not fake.made  # not even opened


def test_the_task_names_its_decoder_in_the_feed_line_and_summary(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from musubi.tasks.detection import DetectionTask

    ann = small_set(tmp_path, images=2, width=64, height=48)
    spec = JobSpec(name="det", task="detection", model="fasterrcnn_mobilenet_v3_large_320_fpn",
                   data={"train": {"path": str(tmp_path / "images"), "annotations": str(ann)}},
                   train={"batch": 2})
    fake_codec(monkeypatch)
    task = DetectionTask(spec)
    task.device = GPU  # the decision only (no GPU here)
    task.train_dataset()
    assert task.device_decode and task.jpeg is not None and task.jpeg.name == HARDWARE
    assert f"batched on cuda:0 ({HARDWARE}" in task.feed_path()["decode"]
    assert task.feed_counts()["decoded"]["decoder"] == HARDWARE
    # A CPU rank: the host decoder, said the same way.
    cpu = DetectionTask(JobSpec(**{**spec.model_dump(), "data": {**spec.data.model_dump(exclude_none=True),
                                                                 "gpu_decode": True}}))
    cpu.use_device(torch.device("cpu"))
    cpu.train_dataset()
    assert cpu.feed_counts()["decoded"]["decoder"] == HOST and f"({HOST};" in cpu.feed_path()["decode"]


def test_jpeg_decoder_is_refused_where_nothing_decodes_on_the_device() -> None:
    from pydantic import ValidationError

    split = {"path": "x", "annotations": "y.json"}
    with pytest.raises(ValidationError, match="jpeg_decoder: hardware chooses the device's JPEG decoder, but "
                       "gpu_decode: false"):
        JobSpec(name="d", task="detection", model="fcos_resnet50_fpn",
                data={"train": split, "gpu_decode": False, "jpeg_decoder": "hardware"})
    assert JobSpec(name="d", task="detection", model="fcos_resnet50_fpn",
                   data={"train": split, "jpeg_decoder": "cuda"}).data.jpeg_decoder == "cuda"


def test_what_a_c_library_prints_at_import_is_captured_not_shown(capfd: pytest.CaptureFixture[str]) -> None:
    with captured_output() as text:
        os.write(2, b"Failed to load nvjpeg2k library! Please install nvJPEG2000\n")
        os.write(1, b"[ERROR] [nvtiff_ext] Failed to load nvTIFF\n")
    assert "nvjpeg2k" in text.getvalue() and "nvTIFF" in text.getvalue()
    out, err = capfd.readouterr()
    assert "nvjpeg2k" not in err and "nvTIFF" not in out
