"""`musubi.evaluate`, `musubi.export` and `musubi.load`: the `evaluate` and `export` commands and predict's model
loading as Python calls.

Each takes its command's options as keywords of the same names (snake_case: `--save-images` is `save_images`)
and calls the functions the command calls. Bad input raises ConfigError in one line worded for a Python caller
(`checkpoint='best'` where the command says `--checkpoint best`); an ONNX export that disagrees with torch raises
ParityError (a ConfigError), where `musubi export` exits 1. Nothing here imports torch until a call is made, so
`import musubi.evaluate` stays cheap.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES

#: Each call's keywords: the options of its command (tests/api/test_parity.py compares them).
EVALUATE_KEYWORDS = ("device", "export", "runs", "warmup", "predictions", "checkpoint")
EXPORT_KEYWORDS = ("format", "opset", "exporter", "checkpoint")
LOAD_KEYWORDS = ("checkpoint", "device", "db")
#: Options that are switches: a bare `--export` reads `export=True`.
SWITCHES = frozenset({"export", "save_images"})
#: What `format=` takes.
FORMATS = ("onnx", "pt")


#: The commands' argument names (help text spells them in capitals) as the calls' parameters.
ARGUMENTS = {"MODEL": "model", "SOURCE": "source"}


def as_keywords(message: str, keywords: Iterable[str]) -> str:
    """`message` with each command-line flag of `keywords` written as a keyword (`--checkpoint 120` ->
    `checkpoint=120`, a switch `--export` -> `export=True`, the argument `MODEL x` -> `model=x`); a command quoted
    in backticks stays a command."""
    parts = message.split("`")
    names = sorted(keywords, key=len, reverse=True)  # --exporter before --export
    for i in range(0, len(parts), 2):  # even parts lie outside backticks
        for argument, name in ARGUMENTS.items():
            parts[i] = re.sub(rf"\b{argument} (?=\S)", f"{name}=", parts[i])
        for name in names:
            flag = re.escape("--" + name.replace("_", "-"))
            if name in SWITCHES:
                parts[i] = re.sub(rf"{flag}(?![\w-])", f"{name}=True", parts[i])
            else:
                parts[i] = re.sub(rf"{flag}(?![\w-]) (?=\S)", f"{name}=", parts[i])
                parts[i] = re.sub(rf"{flag}(?![\w-])", name, parts[i])
    return "`".join(parts)


def _reworded(error: ConfigError, keywords: Iterable[str]) -> ConfigError:
    """The same error type (ParityError stays ParityError) with its message in keywords."""
    return type(error)(as_keywords(str(error), keywords))


def evaluate(job_dir: str | Path, *, device: str | None = None, export: bool = False, runs: int | None = None,
             warmup: int | None = None, predictions: str | Path | None = None,
             checkpoint: str | int = "last") -> dict[str, Any]:
    """`musubi evaluate`: measure a job's FPS by the documented protocol, rewrite its eval.json and return that
    record (metrics, primary_metric, fps, ...); with `predictions=FILE`, write the model's COCO results on the
    validation file there instead and return the summary (file, images, detections, annotations)."""
    from musubi.evaluate.job_eval import evaluate_job
    from musubi.evaluate.predictions import write_predictions

    try:
        if predictions is not None:
            return write_predictions(Path(job_dir), Path(predictions), device, checkpoint)
        return evaluate_job(Path(job_dir), device=device, export=export, fps_runs=runs, fps_warmup=warmup,
                            checkpoint=checkpoint)
    except ConfigError as e:
        raise _reworded(e, EVALUATE_KEYWORDS) from None


@dataclass(frozen=True)
class Exported:
    """What `musubi.export` wrote: the model file, its record beside it (export.json or weights.json) and that
    record's contents (format, step, sha256, classes, parity for ONNX, the load line for .pt)."""

    path: Path
    record_path: Path
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def format(self) -> str:
        """onnx or pt."""
        return str(self.record.get("format"))

    @property
    def step(self) -> int | None:
        """The training step of the exported checkpoint."""
        return self.record.get("step")


def export(job_dir: str | Path, *, format: str = "onnx", opset: int = 17, exporter: str = "auto",  # noqa: A002
           checkpoint: str | int = "last") -> Exported:
    """`musubi export`: write JOB/export/model.onnx (parity-checked against torch with ONNX Runtime) or, with
    `format="pt"`, JOB/export/model.pt (a plain state_dict) and weights.json; the written paths and record."""
    from musubi.evaluate.onnx_export import export_job
    from musubi.evaluate.weights_export import PT_FILE, PT_JSON, export_weights

    if format not in FORMATS:
        raise ConfigError(f"format={format!r}: use onnx or pt")
    job = Path(job_dir)
    try:
        if format == "pt":
            record = export_weights(job, checkpoint)
            return Exported(job / RUN_FILES.export / PT_FILE, job / RUN_FILES.export / PT_JSON, record)
        record = export_job(job, opset=opset, exporter=exporter, checkpoint=checkpoint)
    except ConfigError as e:
        raise _reworded(e, EXPORT_KEYWORDS) from None
    return Exported(job / RUN_FILES.export / record["file"], job / RUN_FILES.export / RUN_FILES.export_record, record)


def load(model: str | Path, *, checkpoint: str | int = "last", device: str | None = None,
         db: str | Path | None = None) -> Any:  # noqa: ANN401 - a musubi.evaluate.predictors.Predictor
    """The model `musubi predict` would run, loaded once: a job directory's checkpoint (best, last or a step), an
    exported .onnx or .pt file, or a registered NAME[:VERSION]. The Predictor has `.classes`, `.task`, `.model`
    (the torch module in eval mode; None for ONNX, whose `.session` is the ONNX Runtime session) and goes to
    `musubi.predict(loaded, source)` as its model."""
    from musubi.evaluate.fps import resolve_device
    from musubi.evaluate.predictors import load_predictor

    try:
        return load_predictor(model, checkpoint, resolve_device(device), Path(db) if db is not None else None)
    except ConfigError as e:
        raise _reworded(e, LOAD_KEYWORDS) from None
