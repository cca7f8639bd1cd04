"""What an Ultralytics `best.pt` says about itself, read without running any of its code.

A `.pt` of Ultralytics is a torch zip archive whose `data.pkl` pickles a dict (ultralytics/engine/trainer.py,
BaseTrainer.save_model): `version` (the Ultralytics that wrote it), `train_metrics` (the validation metrics of the
epoch it was saved at, with `fitness`; `strip_optimizer` keeps them and sets `epoch` to -1), `train_args` (`data`,
`imgsz`, `task`, ...) and `model`, whose attributes hold the class `names`. The pickle is read by an unpickler whose
every class is an inert stand-in and whose tensor storages are never loaded: no foreign code runs, no torch and no
Ultralytics are needed. A file this reader cannot make sense of gives None, never an error: the metrics adapter
then falls back to the fitness rule of the version it can tell.
"""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The largest data.pkl read (the tensors live in other members; a YOLO's pickle is well under 1 MiB).
MAX_PICKLE_BYTES = 64 << 20


class _Inert:
    """Stands in for every class the pickle names: keeps its arguments and state, does nothing else."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _InertUnpickler(pickle.Unpickler):
    """An unpickler that resolves every global to an inert stand-in (never imports, never calls real code)."""

    def find_class(self, module: str, name: str) -> Any:
        return type(name, (_Inert,), {"module": module})

    def persistent_load(self, pid: Any) -> None:  # tensor storages: not read
        return None


@dataclass(frozen=True)
class UltralyticsWeights:
    """The facts of one best.pt."""

    version: str | None
    train_metrics: dict[str, float] = field(default_factory=dict)  # the saved epoch's validation metrics
    names: list[str] | None = None  # class names by class index
    imgsz: int | list[int] | None = None
    data: str | None = None  # the data.yaml it trained on (train_args)
    task: str | None = None


def _state(obj: Any) -> dict[str, Any]:
    state = getattr(obj, "state", None)
    return state if isinstance(state, dict) else {}


def _names(model: Any) -> list[str] | None:
    names = _state(model).get("names")
    if isinstance(names, dict) and names and all(isinstance(k, int) for k in names):
        return [str(names[k]) for k in sorted(names)]
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return list(names)
    return None


def read_weights(path: Path) -> UltralyticsWeights | None:
    """The facts of an Ultralytics checkpoint, or None when it is not one this reader understands."""
    try:
        with zipfile.ZipFile(path) as archive:
            member = next((i for i in archive.infolist() if i.filename.endswith("/data.pkl")
                           or i.filename == "data.pkl"), None)
            if member is None or member.file_size > MAX_PICKLE_BYTES:
                return None
            with archive.open(member) as f:
                data = _InertUnpickler(f).load()
    except Exception:  # noqa: BLE001 - not a zip, a truncated file, a pickle of another shape: no facts
        return None
    if not isinstance(data, dict):
        return None
    metrics = data.get("train_metrics")
    metrics = {str(k): float(v) for k, v in metrics.items() if isinstance(v, (int, float))} \
        if isinstance(metrics, dict) else {}
    args = data.get("train_args") if isinstance(data.get("train_args"), dict) else {}
    imgsz = args.get("imgsz")
    version = data.get("version")
    return UltralyticsWeights(
        version=version if isinstance(version, str) else None, train_metrics=metrics,
        names=_names(data.get("ema") if data.get("ema") is not None else data.get("model")) or _names(data.get("model")),
        imgsz=imgsz if isinstance(imgsz, int) or (isinstance(imgsz, list) and all(isinstance(i, int) for i in imgsz))
        else None,
        data=args.get("data") if isinstance(args.get("data"), str) else None,
        task=args.get("task") if isinstance(args.get("task"), str) else None)
