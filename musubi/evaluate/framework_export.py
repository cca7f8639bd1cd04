"""An external job's recorded weights exported by its own framework, in its own Python (Musubi never imports it).

`metrics_from: ultralytics` records `weights/best.pt`. So that the job is ranked by the speed of that model, timed
like every other job's, the evaluation step runs a short program (ULTRALYTICS_EXPORT) with the job's interpreter:
`YOLO(best.pt).export(...)` to ONNX and to TorchScript, end to end with the framework's NMS where the installed
version offers `nms=True`, at the size it trained at, batch 1, on the device the FPS is timed on; and one validation
image of its data set through Ultralytics' own LetterBox, as the fixed input of the timing. With `YOLO_OFFLINE=1`:
nothing is downloaded or installed (a missing `onnx` in that venv is a note, not a pip run).

Results: `JOB/model.onnx` (what ships when the job wins, its provenance in eval.json's "model_export") and, in
JOB/export/, the TorchScript graph (timed through torch, the runtime of the built-in jobs' headline FPS), the input
sample and the export's log. Anything that fails becomes a one-line reason (ExportUnavailable), never a crash.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from musubi.contract.run_files import RUN_FILES
from musubi.evaluate.registry import file_sha256

#: Files of the export, in JOB/export/ (the ONNX graph itself is JOB/model.onnx, an external job's model file).
TORCHSCRIPT_FILE = "framework.torchscript"
SAMPLE_FILE = "framework-sample.npy"
LOG_FILE = "framework-export.log"
#: Seconds the export may take (a large YOLO exports in well under a minute on a CPU core).
EXPORT_TIMEOUT_S = 900
#: The input of every Ultralytics ONNX graph (exporter.export_onnx: input_names=["images"]).
ONNX_INPUT = "images"
#: The line of the program's output that carries its result.
MARK = "EXPORTED-FOR-MUSUBI "

#: Run as `python -c ULTRALYTICS_EXPORT ARGS_JSON` in the job's interpreter: any Ultralytics 8.x.
ULTRALYTICS_EXPORT = r'''
import json, sys
from pathlib import Path
a = json.loads(sys.argv[1])
import ultralytics
from ultralytics import YOLO
from ultralytics.cfg import DEFAULT_CFG_DICT
model = YOLO(a["weights"])
train_args = (getattr(model, "ckpt", None) or {}).get("train_args") or {}
imgsz = a["imgsz"] or train_args.get("imgsz") or 640
kw = dict(imgsz=imgsz, device=a["device"], batch=1, dynamic=False)
nms = "nms" in DEFAULT_CFG_DICT
if nms:
    kw["nms"] = True
out = {"version": ultralytics.__version__, "nms": nms, "imgsz": imgsz, "task": model.task,
       "names": [str(model.names[k]) for k in sorted(model.names)], "call": dict(kw, simplify=False)}
out["onnx"] = str(model.export(format="onnx", simplify=False, **kw))
try:
    out["torchscript"] = str(model.export(format="torchscript", **kw))
except Exception as e:
    out["torchscript_error"] = f"{type(e).__name__}: {e}"[:300]
try:  # the fixed input of the timing: the first validation image through Ultralytics' own LetterBox
    import cv2, numpy as np, yaml
    from ultralytics.data.augment import LetterBox
    data = Path(train_args.get("data") or "")
    spec = yaml.safe_load(data.read_text())
    root = Path(spec.get("path") or data.parent)
    root = root if root.is_absolute() else data.parent / root
    val = spec.get("val") or spec.get("test")
    images = []
    for v in (val if isinstance(val, list) else [val]):
        p = Path(v) if Path(v).is_absolute() else root / v
        if p.is_dir():
            images += sorted(f for f in p.rglob("*") if f.suffix.lower() in (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"))
        elif p.suffix == ".txt":
            images += [Path(s.strip()) if Path(s.strip()).is_absolute() else root / s.strip() for s in p.read_text().splitlines() if s.strip()]
        elif p.is_file():
            images.append(p)
    size = imgsz if isinstance(imgsz, (list, tuple)) else (imgsz, imgsz)
    im = LetterBox(new_shape=tuple(size), auto=False)(image=cv2.imread(str(images[0])))
    np.save(a["sample"], np.ascontiguousarray(im[..., ::-1].transpose(2, 0, 1)[None]).astype("float32") / 255)
    out["sample_image"] = str(images[0])
except Exception as e:
    out["sample_error"] = f"{type(e).__name__}: {e}"[:300]
print("EXPORTED-FOR-MUSUBI " + json.dumps(out), flush=True)
'''


class ExportUnavailable(Exception):
    """The framework's model could not be had: the one-line reason is the message."""


def _env() -> dict[str, str]:
    """The export's environment: the evaluation step's (the job's GPUs, its threads), without Musubi's own Python
    path (another venv must not see it), and offline (Ultralytics would otherwise fetch fonts or pip-install)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(YOLO_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def export_current(job_dir: Path, weights: Path, earlier: dict[str, Any] | None) -> bool:
    """Whether an earlier export (eval.json's "model_export") is still the one of these weights: the same
    best.pt (sha256) and JOB/model.onnx unchanged since."""
    model = job_dir / RUN_FILES.onnx
    try:
        return (earlier is not None and model.is_file() and earlier.get("sha256") == file_sha256(model)
                and earlier.get("weights_sha256") == file_sha256(weights))
    except OSError:
        return False


def export_ultralytics(job_dir: Path, weights: Path, python: str | None, device: str,
                       imgsz: int | list[int] | None = None) -> dict[str, Any]:
    """Export best.pt with Ultralytics in `python` (device "cpu" or a CUDA index): JOB/model.onnx and the files
    of JOB/export/; returns eval.json's "model_export" record (ExportUnavailable with the reason otherwise)."""
    if not python:
        raise ExportUnavailable(f"no Python with Ultralytics is known to export {weights} (the command names no "
                                "interpreter): set metrics_from.python to the venv's bin/python")
    if not (Path(python).exists() or shutil.which(python)):
        raise ExportUnavailable(f"{python}: no such interpreter to export {weights} with; set metrics_from.python")
    folder = job_dir / RUN_FILES.export
    folder.mkdir(parents=True, exist_ok=True)
    sample, log = folder / SAMPLE_FILE, folder / LOG_FILE
    sample.unlink(missing_ok=True)
    args = {"weights": str(weights.resolve()), "device": device, "imgsz": imgsz, "sample": str(sample.resolve())}
    started = time.perf_counter()
    try:
        done = subprocess.run([python, "-c", ULTRALYTICS_EXPORT, json.dumps(args)], cwd=folder, env=_env(),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ExportUnavailable(f"the export of {weights} took over {EXPORT_TIMEOUT_S} s and was stopped") from None
    except OSError as e:
        raise ExportUnavailable(f"{python}: cannot run it ({e})") from None
    seconds = time.perf_counter() - started
    log.write_text(f"$ {python} -c ULTRALYTICS_EXPORT '{json.dumps(args)}'\n{done.stdout}{done.stderr}",
                   encoding="utf-8")
    result = next((json.loads(ln[len(MARK):]) for ln in done.stdout.splitlines() if ln.startswith(MARK)), None)
    if done.returncode != 0 or result is None:
        last = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        why = last[-1][:240] if last else f"exit {done.returncode}"
        raise ExportUnavailable(f"Ultralytics' export of {weights} in {python} failed ({why}); see {log}")
    model = job_dir / RUN_FILES.onnx
    shutil.move(result["onnx"], model)
    record: dict[str, Any] = {
        "by": "musubi, with the framework's own exporter in the job's Python", "python": python,
        "framework": f"ultralytics {result['version']}",
        "call": "YOLO(best.pt).export(format='onnx', " + ", ".join(f"{k}={v!r}" for k, v in result["call"].items())
                + ")",
        "nms": bool(result["nms"]), "imgsz": result["imgsz"], "task": result["task"],
        "weights": str(weights), "weights_sha256": file_sha256(weights), "file": RUN_FILES.onnx,
        "sha256": file_sha256(model), "seconds": round(seconds, 2), "log": f"{RUN_FILES.export}/{LOG_FILE}",
        "classes": result["names"],
    }
    if "torchscript" in result:
        shutil.move(result["torchscript"], folder / TORCHSCRIPT_FILE)
        record["torchscript"] = f"{RUN_FILES.export}/{TORCHSCRIPT_FILE}"
    else:
        record["torchscript_error"] = result.get("torchscript_error")
    if sample.is_file():
        record.update(sample=f"{RUN_FILES.export}/{SAMPLE_FILE}", sample_image=result.get("sample_image"))
    else:
        record["sample_error"] = result.get("sample_error") or "no validation image found"
    return record


def input_shape(imgsz: Any) -> list[int]:
    """[1, 3, H, W] of an Ultralytics imgsz (an int or [h, w])."""
    size = list(imgsz) if isinstance(imgsz, (list, tuple)) else [int(imgsz), int(imgsz)]
    return [1, 3, int(size[0]), int(size[-1])]


def framework_fps(job_dir: Path, export: dict[str, Any], device: str | None, warmup: int | None,
                  runs: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(headline, by runtime) FPS of the exported model by the shared protocol: its TorchScript graph through
    torch (the headline, as the built-in jobs' is) and JOB/model.onnx through ONNX Runtime, both on the sample."""
    import numpy as np

    from musubi.contract.errors import ConfigError
    from musubi.evaluate.fps import onnx_fps, torchscript_fps

    sample = np.load(job_dir / export["sample"]) if export.get("sample") else None
    shape = input_shape(export.get("imgsz") or 640)
    fps_all: dict[str, Any] = {}
    if export.get("torchscript"):
        export.pop("torchscript_error", None)  # an earlier evaluation's reason: timed afresh now
        try:
            timed = torchscript_fps(job_dir / export["torchscript"], sample, shape, device, warmup, runs)
            fps_all[timed["runtime"]] = timed
        except ConfigError as e:  # ranked by its ONNX Runtime figure instead, the reason kept
            export["torchscript_error"] = str(e)
    feeds = {ONNX_INPUT: sample} if sample is not None else None
    timed = onnx_fps(job_dir / RUN_FILES.onnx, feeds, device, warmup, runs, shape)
    fps_all[timed["runtime"]] = timed
    for entry in fps_all.values():
        entry["unit"] = "whole image"
        entry["model"] = "the framework's export of weights/best.pt" + (", NMS included" if export.get("nms") else "")
    headline = next(iter(fps_all.values()))  # TorchScript first when it ran
    return headline, fps_all


def timing_device(device: str | None) -> str:
    """The device Ultralytics exports on: the one the FPS is timed on ("cpu", or the job's first visible GPU)."""
    from musubi.evaluate.fps import resolve_device

    return "0" if resolve_device(device).type == "cuda" else "cpu"
