"""The per-job evaluation step the fleet runs after training: metrics, FPS by the protocol, optional export.

Task jobs: the validation metrics come from the runtime's eval.json; FPS is
measured here through torch on the job's device (the headline figure, the same
runtime for every task job of a fleet), and through ONNX Runtime when the model
is exported. External jobs: their eval.json is validated and used as is; FPS is
measured with ONNX Runtime on their model.onnx only when they reported none.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.recovery.numerics import trained_precision
from musubi.store.rundir import read_json, write_json

if TYPE_CHECKING:  # model_io imports torch: an external job's evaluation imports none
    from musubi.evaluate.model_io import JobModel

EVAL_FILE = RUN_FILES.eval


def _read_eval(path: Path) -> dict[str, Any]:
    """The runtime's eval.json of a task job ({} when validation did not run)."""
    if not path.is_file():
        return {}
    try:
        data = read_json(path)
    except (OSError, ValueError):
        raise ConfigError(f"{path}: not readable JSON; re-run the job's validation or delete the file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be an object with a \"metrics\" key")
    return data


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def export_entry(exported: dict[str, Any]) -> dict[str, Any]:
    """eval.json's "export" entry for an export record (export_loaded's): "record" is where the fleet's ship()
    finds which checkpoint was exported, so it registers an export done early instead of exporting again."""
    return {"file": f"{RUN_FILES.export}/{exported['file']}", "record": f"{RUN_FILES.export}/{RUN_FILES.export_record}",
            "sha256": exported["sha256"], "opset": exported["opset"], "parity_ok": exported["parity"]["ok"]}


def export_evaluated(job_dir: Path, loaded: JobModel | None = None) -> dict[str, Any]:
    """Export an evaluated task job exactly as the fleet's ship() does (export_job: ONNX and parity, no ONNX
    Runtime FPS) and record it as eval.json's "export"; return that entry ({"error"} when it did not export).
    `loaded`: the model its evaluation loaded (evaluate_job's on_loaded), exported as it is instead of read again
    from its checkpoint (the same newest checkpoint; a detector's load is seconds of CPU)."""
    from musubi.evaluate.onnx_export import export_job, export_loaded

    path = job_dir / EVAL_FILE
    try:
        entry = export_entry(export_loaded(loaded) if loaded is not None else export_job(job_dir))
    except ConfigError as e:  # parity failure or no exporter: recorded, and ship() tries (and reports) again
        entry = {"error": str(e)}
    record = _read_eval(path)
    record["export"] = entry
    write_json(path, record)
    return entry


def evaluate_task_job(job_dir: Path, device: str | None, export: bool, fps_runs: int | None,
                      fps_warmup: int | None, reached: Callable[[str], None] | None = None,
                      checkpoint: str | int | None = None,
                      on_loaded: Callable[[JobModel], None] | None = None) -> dict[str, Any]:
    """FPS (torch, then ONNX Runtime if exported) of a Musubi task job; eval.json updated. `reached(mark)`:
    told "eval_loaded" once the model is on its device and "eval_fps" once its FPS is measured (the fleet's
    evaluation step marks them: where the step's seconds go). `on_loaded(job)`: given the loaded model (back on
    the CPU once its FPS is measured), for a later export that need not read the checkpoint again."""
    from musubi.evaluate.export_plan import export_plan
    from musubi.evaluate.fps import onnx_fps, torch_fps
    from musubi.evaluate.model_io import load_job_model, sample_batch
    from musubi.evaluate.onnx_export import export_loaded
    from musubi.evaluate.recipe import slice_rule
    from musubi.evaluate.sliced_fps import fps_unit, tiled_onnx_fps

    path = job_dir / EVAL_FILE
    record = _read_eval(path)
    job = load_job_model(job_dir, checkpoint)
    if on_loaded is not None:
        on_loaded(job)
    if reached is not None:
        reached("eval_loaded")
    record.setdefault("metrics", {})
    record.setdefault("primary_metric", job.task.primary_metric)
    record["kind"] = "task"
    precision = trained_precision(job_dir)
    if precision is not None:
        record["precision"] = precision  # what it trained in, after any fallback (leaderboard, registry, manifest)
    fps_all: dict[str, Any] = {}
    exported = None
    if export:
        try:
            exported = export_loaded(job)
            record["export"] = export_entry(exported)
        except ConfigError as e:  # a model that does not export is still measured and ranked
            record["export"] = {"error": str(e)}
    headline = torch_fps(job, device, fps_warmup, fps_runs)
    headline["unit"] = fps_unit(job, headline.get("input_shape"))  # a whole image, or a whole frame from tiles
    if reached is not None:
        reached("eval_fps")
    fps_all[headline["runtime"]] = headline
    if exported is not None:
        if slice_rule(job.spec) is not None:  # the one-tile graph timed as deployed: tiled and merged
            ort = tiled_onnx_fps(job, job_dir / RUN_FILES.export / RUN_FILES.onnx, device, fps_warmup, fps_runs)
        else:
            plan = export_plan(job)
            feeds = {plan.input_name: plan.to_input(sample_batch(job.task, 1)).numpy()}
            ort = onnx_fps(job_dir / RUN_FILES.export / RUN_FILES.onnx, feeds, device, fps_warmup, fps_runs)
            ort["unit"] = headline["unit"]
        fps_all[ort["runtime"]] = ort
    record.update(fps=headline, fps_all=fps_all, checkpoint_step=job.step, evaluated=_now())
    write_json(path, record)
    return record


def evaluate_external_job(job_dir: Path, device: str | None, fps_runs: int | None,
                          fps_warmup: int | None) -> dict[str, Any]:
    """Validate an external job's eval.json (first written from its framework's files when it declared
    metrics_from); without an FPS of its own, time a model: the framework's export of its recorded weights
    (metrics_from: ultralytics, framework_export.py), else its model.onnx."""
    from musubi.evaluate.external import read_external_eval

    path = job_dir / EVAL_FILE
    declared = job_dir / RUN_FILES.metrics_from
    spec: dict[str, Any] = {}
    earlier = _read_eval(path).get("model_export") if path.is_file() else None  # before the adapter rewrites it
    if declared.is_file():
        from musubi.evaluate.adapters import adapt_metrics

        try:
            spec = read_json(declared)
        except (OSError, ValueError):
            raise ConfigError(f"{declared}: not readable JSON; run the fleet again (it writes this file)") from None
        write_json(path, adapt_metrics(job_dir, spec["format"], spec.get("path"), spec.get("metrics")))
    record = read_external_eval(path)
    record["kind"] = "external"
    model = job_dir / RUN_FILES.onnx
    fps = record.get("fps")
    if fps is not None:
        fps.setdefault("runtime", "reported by the external program")
        fps.setdefault("protocol", "the external program's own (not verified by Musubi)")
    elif spec.get("format") == "ultralytics" and spec.get("export", True) and record.get("weights"):
        _time_framework_export(job_dir, spec, record, earlier, device, fps_runs, fps_warmup)
    elif model.is_file():
        from musubi.evaluate.fps import onnx_fps

        try:
            record["fps"] = onnx_fps(model, None, device, fps_warmup, fps_runs, record.get("input_shape"))
        except ConfigError as e:
            # Not the job's fault that its graph has axes we cannot fill: ranked without FPS, reason kept.
            record["fps_missing"] = f"{model}: {e}"
    else:
        record["fps_missing"] = "the external program reported no fps and wrote no model.onnx" + (
            " (and its framework recorded no weights/best.pt to export)" if spec.get("format") == "ultralytics"
            else "")
    record["evaluated"] = _now()
    write_json(path, record)
    return record


def _time_framework_export(job_dir: Path, spec: dict[str, Any], record: dict[str, Any],
                           earlier: dict[str, Any] | None, device: str | None, fps_runs: int | None,
                           fps_warmup: int | None) -> None:
    """Export the job's best.pt with its framework in its Python (again only when the weights changed) and time it
    by the protocol; record "model_export", "fps", "fps_all", or "fps_missing" with the reason."""
    from musubi.evaluate.framework_export import (
        ExportUnavailable,
        export_current,
        export_ultralytics,
        framework_fps,
        timing_device,
    )

    weights = Path(record["weights"])
    weights = weights if weights.is_absolute() else job_dir / weights
    try:
        if earlier is not None and export_current(job_dir, weights, earlier):
            made = earlier
        else:
            made = export_ultralytics(job_dir, weights, spec.get("python"), timing_device(device),
                                      record.get("input_size"))
        record["model_export"] = made
        record.setdefault("classes", made.get("classes"))
        record["fps"], record["fps_all"] = framework_fps(job_dir, made, device, fps_warmup, fps_runs)
    except (ExportUnavailable, ConfigError) as e:
        record["fps_missing"] = f"no model to time: {e}"


def evaluate_job(job_dir: Path, device: str | None = None, export: bool = False, fps_runs: int | None = None,
                 fps_warmup: int | None = None, reached: Callable[[str], None] | None = None,
                 checkpoint: str | int | None = None,
                 on_loaded: Callable[[JobModel], None] | None = None) -> dict[str, Any]:
    """Evaluate one finished job (task or external) and rewrite its eval.json with "fps"; return the record.

    `device`: cpu, cuda or cuda:N (default: a GPU if visible). `fps_runs`/`fps_warmup`: timed and
    untimed runs (default 100/10 on a GPU, 10/3 on the CPU). `export`: also write export/model.onnx
    (parity-checked) and time it with ONNX Runtime. `checkpoint`: best, last or a step (task jobs; default the
    newest). `on_loaded`: see evaluate_task_job (task jobs only).
    """
    from musubi.evaluate.model_io import is_task_job

    job_dir = Path(job_dir)
    if not job_dir.is_dir():
        raise ConfigError(f"{job_dir}: no such job directory")
    if is_task_job(job_dir):
        return evaluate_task_job(job_dir, device, export, fps_runs, fps_warmup, reached, checkpoint, on_loaded)
    if not any((job_dir / f).is_file() for f in (EVAL_FILE, RUN_FILES.job, RUN_FILES.metrics_from)):
        raise ConfigError(f"{job_dir}: neither job.json nor eval.json; not a job directory")
    if checkpoint not in (None, "last"):
        raise ConfigError(f"--checkpoint {checkpoint}: {job_dir.name} is an external job (its program keeps its own "
                          "weights); evaluate it without --checkpoint")
    return evaluate_external_job(job_dir, device, fps_runs, fps_warmup)
