"""What `musubi predict` runs on: an image, a folder, a glob, a video file's frames, or numpy arrays.

Each becomes a list of `Frame`s (a name and a file or an array), and each frame is
read exactly as evaluation read the validation files (`read_frame`): RGB through
PIL and resized by its longest side where the job set data.image_size,
single-channel frames without loss in their stored units, classifier inputs
resized and centre-cropped. Video is read only where a reader is installed
(OpenCV, PyAV or torchvision's read_video); otherwise a one-line error says which to install.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torchvision.transforms.functional import pil_to_tensor

from musubi.contract.errors import ConfigError
from musubi.data import guards
from musubi.data.single_channel import read_single_channel

#: Image files a folder or glob contributes (by suffix, case-insensitive).
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".gif", ".ppm", ".pgm"})
#: Files read as videos (their frames, in order).
VIDEO_SUFFIXES = frozenset({".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg"})


@dataclass(frozen=True)
class Frame:
    """One image to predict on: a file, or an array (from Python or a video)."""

    name: str  # the file's path relative to the source folder, or `array3`, or `clip.mp4#000012`
    path: Path | None = None
    array: np.ndarray | None = None


@dataclass
class HostImage:
    """A frame as the job's data set gives it (before to_device), and what maps its boxes back to the file."""

    tensor: Tensor  # uint8 [3, h, w] RGB, or float32 [1, h, w] in stored units, or a classifier's input [3, S, S]
    width: int  # the file's (or array's) own size
    height: int
    rgb: np.ndarray  # uint8 [H, W, 3] of the file, for drawing

    @property
    def scale(self) -> tuple[float, float]:
        """Model-input pixels -> file pixels (x, y)."""
        return self.width / self.tensor.shape[-1], self.height / self.tensor.shape[-2]


def _video_frames(path: Path) -> list[Frame]:
    """Every frame of a video file as RGB arrays (OpenCV, else PyAV, else torchvision.io.read_video)."""
    try:
        import cv2  # type: ignore[import-not-found]
    except ImportError:
        cv2 = None
    frames: list[np.ndarray] = []
    if cv2 is not None:
        capture = cv2.VideoCapture(str(path))
        ok, bgr = capture.read()
        while ok:
            frames.append(bgr[:, :, ::-1].copy())
            ok, bgr = capture.read()
        capture.release()
    else:
        try:
            import av  # type: ignore[import-not-found]
        except ImportError:
            av = None
        if av is not None:
            with av.open(str(path)) as container:
                frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        else:
            import torchvision.io as tvio

            if not hasattr(tvio, "read_video"):
                raise ConfigError(f"{path}: reading a video needs a reader: pip install av (or opencv-python); "
                                  "none is installed (or extract the frames as images and predict on the folder)")
            video, _, _ = tvio.read_video(str(path), pts_unit="sec", output_format="THWC")
            frames = [f.numpy() for f in video]
    if not frames:
        raise ConfigError(f"{path}: no frame could be read from this video; check the file plays")
    return [Frame(f"{path.name}#{n:06d}", None, f) for n, f in enumerate(frames)]


def _is_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


def _folder_images(folder: Path) -> list[Frame]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    return [Frame(p.relative_to(folder).as_posix(), p) for p in files]


def resolve_source(source: Any) -> list[Frame]:
    """The frames of SOURCE (a path, glob, folder, video, array or list of them); ConfigError when it has none."""
    if isinstance(source, np.ndarray):
        return [Frame("array0", None, source)]
    if isinstance(source, (list, tuple)):
        out: list[Frame] = []
        for n, item in enumerate(source):
            out += [Frame(f"array{n}", None, item)] if isinstance(item, np.ndarray) else resolve_source(item)
        if not out:
            raise ConfigError("SOURCE: an empty list; give image files, a folder or arrays")
        return out
    text = str(source)
    path = Path(text)
    if path.is_dir():
        frames = _folder_images(path)
        if not frames:
            raise ConfigError(f"{path}: no image files inside ({', '.join(sorted(IMAGE_SUFFIXES))}); give a folder "
                              "of images, an image, a glob or a video")
        return frames
    if path.is_file():
        if path.suffix.lower() in VIDEO_SUFFIXES:
            return _video_frames(path)
        return [Frame(path.name, path)]
    if _is_glob(text):
        files = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
        if not files:
            raise ConfigError(f"{text}: the pattern matches no file; check the glob (quote it in the shell)")
        return [Frame(p.name, p) for p in files]
    raise ConfigError(f"SOURCE {text}: no such file or folder; give an image, a folder, a glob or a video file")


def _rgb_image(frame: Frame) -> Image.Image:
    if frame.path is not None:
        return guards.open_image(frame.path)
    arr = np.asarray(frame.array)
    if arr.dtype != np.uint8 or arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (1, 3, 4)):
        raise ConfigError(f"{frame.name}: an array of {arr.dtype} {list(arr.shape)}; give uint8 [H, W, 3] RGB "
                          "(or [H, W] grey) for an RGB model")
    return Image.fromarray(arr.squeeze(2) if arr.ndim == 3 and arr.shape[2] == 1 else arr).convert("RGB")


def _single_channel(frame: Frame) -> np.ndarray:
    if frame.path is not None:
        return read_single_channel(frame.path)
    arr = np.asarray(frame.array)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.number):
        raise ConfigError(f"{frame.name}: an array of {arr.dtype} {list(arr.shape)}; a single-channel model takes "
                          "[H, W] numbers in the stored units it trained on")
    return arr


def _display(values: np.ndarray) -> np.ndarray:
    """A single-channel frame stretched to uint8 RGB for drawing."""
    lo, hi = float(values.min()), float(values.max())
    grey = ((values - lo) / (hi - lo) * 255).astype(np.uint8) if hi > lo else np.zeros(values.shape, np.uint8)
    return np.repeat(grey[:, :, None], 3, axis=2)


def read_frame(frame: Frame, recipe: dict[str, Any]) -> HostImage:
    """The frame as the job's validation data gave its files (see musubi.data.coco and image_folder)."""
    spec = recipe.get("input") or {}
    task = recipe.get("task")
    if task == "classification":
        from torchvision import transforms

        im = _rgb_image(frame)
        tf = transforms.Compose([transforms.Resize(spec["resize_shorter"]), transforms.CenterCrop(spec["center_crop"]),
                                 transforms.ToTensor(), transforms.Normalize(spec["mean"], spec["std"])])
        return HostImage(tf(im), im.width, im.height, np.asarray(im))
    if task != "detection":
        raise ConfigError(f"predict: task {task!r} has no image input; predict runs detection and classification")
    side = spec.get("resize_longest")
    if spec.get("channels") == 1:
        values = _single_channel(frame)
        image = torch.from_numpy(values.astype("float32"))[None]
        h, w = image.shape[1:]
        if side is not None:  # as CocoDetection._single_channel: bilinear with antialias, stored units kept
            scale = side / max(w, h)
            size = (max(1, round(h * scale)), max(1, round(w * scale)))
            image = F.interpolate(image[None], size=size, mode="bilinear", align_corners=False, antialias=True)[0]
        return HostImage(image, w, h, _display(values))
    im = _rgb_image(frame)
    w, h = im.size
    rgb = np.asarray(im)
    if side is not None:  # as CocoDetection: longest side to image_size, PIL bilinear
        scale = side / max(w, h)
        im = im.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BILINEAR)
    return HostImage(pil_to_tensor(im), w, h, rgb)


def model_input(host: HostImage, recipe: dict[str, Any]) -> Tensor:
    """A detector's float input from a host image, as the task's to_device makes it (exported models' path)."""
    spec = recipe["input"]
    image = host.tensor
    if spec.get("channels") == 1:
        image = image.float().sub_(spec["mean"][0]).div_(spec["std"][0])
        return image.expand(3, -1, -1) if spec.get("replicate") else image
    return image.float().div_(255.0)
