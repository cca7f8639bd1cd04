"""Export a job's trained model to ONNX and check it against torch with ONNX Runtime on real inputs.

Writes JOB/export/model.onnx and JOB/export/export.json (opset, exporter, inputs
and outputs, input meaning, parity figures, sha256). The file is written beside
the old one and renamed into place, so a failed export never destroys an
earlier good one.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from musubi.contract.errors import ConfigError, one_line
from musubi.contract.run_files import RUN_FILES
from musubi.evaluate.detector_stages import (
    PROBE_OUTPUTS,
    detector_cuts,
    proposal_probe,
    replay_box_head,
    rpn_cuts,
)
from musubi.evaluate.export_plan import DetectorForExport, ExportPlan, export_plan
from musubi.evaluate.model_io import JobModel, load_job_model, sample_batch
from musubi.evaluate.parity import (
    compare_detections,
    compare_tensors,
    explain_by_proposals,
    judge_detections,
    merge,
)
from musubi.evaluate.recipe import inference_recipe, stamp_onnx
from musubi.evaluate.registry import file_sha256
from musubi.store.rundir import write_json
from musubi.tasks.rebuild import model_recipe

#: ONNX opset: 17 is what TensorRT 8.5+ (JetPack 5) and ONNX Runtime >= 1.14 all read.
DEFAULT_OPSET = 17
#: Real validation samples that torch and ONNX Runtime are compared on.
DEFAULT_PARITY_INPUTS = 4
#: Where an export whose parity check failed is kept (for inspection), beside the last good one.
FAILED_FILE, FAILED_JSON = "model.parity-failed.onnx", "export-failed.json"


class ParityError(ConfigError):
    """The exported graph's outputs differ from torch's beyond tolerance."""


def _export_once(plan: ExportPlan, example: torch.Tensor, path: Path, opset: int, exporter: str) -> None:
    """One torch.onnx.export call with the given exporter."""
    # The TorchScript exporter is deprecated upstream but is the one that handles torchvision detectors
    # (and gives opset 17 exactly); its tracer warnings about Python control flow are expected here.
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(
                plan.module, (example,), str(path), dynamo=False, opset_version=opset,
                input_names=[plan.input_name], output_names=plan.output_names,
                dynamic_axes=plan.dynamic_axes or None, do_constant_folding=True,
            )
        else:
            dims = ({0: torch.export.Dim("batch")},) if plan.dynamic_batch else None
            torch.onnx.export(
                plan.module, (example,), str(path), dynamo=True, opset_version=opset,
                input_names=[plan.input_name], output_names=plan.output_names,
                dynamic_shapes=dims, external_data=False,
            )


def _export(plan: ExportPlan, example: torch.Tensor, path: Path, opset: int, exporters: list[str]) -> str:
    """Export with the first exporter that succeeds; returns its name (ConfigError if none does)."""
    errors = []
    for exporter in exporters:
        try:
            _export_once(plan, example, path, opset, exporter)
            return exporter
        except Exception as e:  # each exporter fails in its own ways; the next one may not
            errors.append(f"{exporter}: {one_line(e)}")
            path.unlink(missing_ok=True)
    raise ConfigError(f"export: torch.onnx.export failed ({'; '.join(errors)})")


def _graph_io(path: Path, model: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(inputs, outputs, opset) of an ONNX file (`model`: its ModelProto where already loaded), after onnx.checker
    has accepted the file."""
    import onnx

    model = onnx.load(str(path)) if model is None else model
    try:
        # the file by its path: checked in C++ without serialising the (hundreds of MB) proto in Python again
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        raise ConfigError(f"{path}: the exported graph is not valid ONNX ({one_line(e)})") from None

    def describe(values: Any) -> list[dict[str, Any]]:
        out = []
        for v in values:
            t = v.type.tensor_type
            shape = [d.dim_param or d.dim_value for d in t.shape.dim]
            out.append({"name": v.name, "shape": shape,
                        "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name})
        return out

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return describe(model.graph.input), describe(model.graph.output), opset


def _as_numpy(out: Any) -> list[np.ndarray]:
    items = out if isinstance(out, (tuple, list)) else [out]
    return [t.detach().cpu().numpy() for t in items]


def check_parity(plan: ExportPlan, path: Path, batches: list[Any], names: list[str] | None = None,
                 opset: int = DEFAULT_OPSET) -> dict[str, Any]:
    """Run torch and ONNX Runtime (CPU) on the same host batches and compare (see parity.py for tolerances).

    Detections are paired by IoU and score, and every difference is explained by a decision boundary (score
    threshold, top-k cut, NMS near-tie; for an R-CNN also its RPN's, through a probe of its proposals) or
    counted as a real disagreement; with the batches' ground truth, the mAP of both sides' predictions on
    these samples is reported and must agree. `names`: class names for the messages.
    """
    from musubi.evaluate.fps import onnx_session

    session, _ = onnx_session(path, torch.device("cpu"))
    cuts = detector_cuts(plan.module) if plan.compare == "detections" else None
    results = []
    runs: list[tuple[torch.Tensor, list[np.ndarray]]] = []
    preds: dict[str, list[dict[str, torch.Tensor]]] = {"torch": [], "onnx": []}
    with torch.no_grad():
        for batch in batches:
            x = plan.to_input(batch)
            ref = _as_numpy(plan.module(x))
            try:
                got = session.run(None, {plan.input_name: x.numpy()})
            except Exception as e:  # noqa: BLE001 - ORT's errors share no useful base class
                # A graph that fails on a real input is no export: say so as a parity failure.
                raise ParityError(f"{path.name}: ONNX Runtime fails on a real input of shape "
                                  f"{list(x.shape)} ({one_line(e)}); the export is not usable") from None
            if plan.compare == "detections":
                results.append(compare_detections(tuple(ref), tuple(got), cuts))
                runs.append((x, got))
                for side, out in (("torch", ref), ("onnx", got)):
                    preds[side].append({k: torch.from_numpy(np.asarray(v)) for k, v in
                                        zip(("boxes", "scores", "labels"), out, strict=True)})
            else:
                results.append(compare_tensors(ref[0], got[0]))
    if plan.compare == "detections":
        if not all(r["ok"] for r in results):
            results = _explain_upstream(plan, path, runs, results, opset)
        targets = [t for batch in batches for t in plan.to_targets(batch)] if plan.to_targets else None
        ids = [int(t["image_id"]) for t in targets] if targets and all("image_id" in t for t in targets) else None
        out = judge_detections(results, _sample_maps(preds, targets) if targets else None, names, ids)
    else:
        out = merge(results)
    out["runtime"] = "onnxruntime-cpu vs torch-cpu"
    return out


def _explain_upstream(plan: ExportPlan, path: Path, runs: list[tuple[torch.Tensor, list[np.ndarray]]],
                      results: list[dict[str, Any]], opset: int) -> list[dict[str, Any]]:
    """For an R-CNN with disagreements no output decision explains: export the proposal probe beside `path`,
    run it on both sides and explain each such input by its RPN's near-ties (`explain_by_proposals`)."""
    from musubi.evaluate.fps import onnx_session

    probe = proposal_probe(plan.module)
    if probe is None:
        return results
    tmp = path.with_name(f".{path.stem}.proposals.{os.getpid()}.tmp")
    probe_plan = copy.copy(plan)
    probe_plan.module = probe
    probe_plan.output_names = PROBE_OUTPUTS
    probe_plan.dynamic_axes = {**plan.dynamic_axes, **{n: {0: "detections"} for n in PROBE_OUTPUTS}}
    try:
        _export_once(probe_plan, runs[0][0], tmp, opset, "torchscript")
        session, _ = onnx_session(tmp, torch.device("cpu"))
        explained = []
        with torch.no_grad():
            for (x, got), result in zip(runs, results, strict=True):
                if result["ok"]:
                    explained.append(result)
                    continue
                ref = _as_numpy(probe(x))
                seen = session.run(None, {plan.input_name: x.numpy()})
                same = all(np.array_equal(a, b) for a, b in zip(seen[:3], got, strict=True))
                none = np.zeros(len(ref[4]), np.int64), np.zeros(len(seen[4]), np.int64)
                props = compare_detections((ref[3], ref[4], none[0]), (seen[3], seen[4], none[1]),
                                           rpn_cuts(plan.module))
                replay = compare_detections(replay_box_head(plan.module, x, seen[3]), tuple(got),
                                            detector_cuts(plan.module))
                explained.append(explain_by_proposals(result, props, replay, same))
        return explained
    finally:
        tmp.unlink(missing_ok=True)


def _sample_maps(preds: dict[str, list[dict[str, torch.Tensor]]],
                 targets: list[dict[str, torch.Tensor]]) -> dict[str, dict[str, float]] | None:
    """mAP50 and mAP50-95 of torch's and ONNX Runtime's predictions on the parity samples (the training
    metric, one process), or None without the eval extra or ground truth."""
    from musubi.tasks.detection import DetectionMetric, map_backend

    try:
        backend = map_backend()
    except ConfigError:
        return None
    maps = {}
    for side, side_preds in preds.items():
        metric = DetectionMetric(torch.device("cpu"), backend)
        metric.update(side_preds, (None, targets))
        values = metric.compute(lambda t: t)  # one process: the sum over ranks is the tensor itself
        maps[side] = {k: round(values[k], 6) for k in ("map50", "map")}
    return None if maps["torch"]["map50"] == -1 else maps


def _parity_batches(job: JobModel, plan: ExportPlan, count: int) -> list[Any]:
    """Real samples: one batch of `count` when the batch axis is symbolic (exercising it), else one by one."""
    if plan.dynamic_batch:
        return [sample_batch(job.task, count)]
    return [sample_batch(job.task, 1, start=i) for i in range(count)]


def _lower_score_threshold(module: nn.Module) -> bool:
    """Set a detector's score threshold to 0 (all kept boxes reported); False if it has none."""
    found = False
    for sub in module.modules():
        if hasattr(sub, "score_thresh") and isinstance(sub.score_thresh, float):
            sub.score_thresh = 0.0
            found = True
    return found


def _all_scores_parity(plan: ExportPlan, batches: list[Any], opset: int, exporter: str,
                       tmp: Path, names: list[str] | None = None) -> dict[str, Any] | None:
    """Parity of a copy exported with score threshold 0: the whole graph is compared even when a
    barely trained detector scores every box below the shipped threshold (no detections to compare)."""
    if not isinstance(plan.module, DetectorForExport):
        return None
    module = copy.deepcopy(plan.module).eval()
    if not _lower_score_threshold(module):
        return None
    probe = copy.copy(plan)
    probe.module = module
    _export_once(probe, plan.to_input(batches[0]), tmp, opset, exporter)
    try:
        return check_parity(probe, tmp, batches, names, opset)
    finally:
        tmp.unlink(missing_ok=True)


def export_job(job_dir: Path, opset: int = DEFAULT_OPSET, parity_inputs: int = DEFAULT_PARITY_INPUTS,
               exporter: str = "auto", checkpoint: str | int | None = None) -> dict[str, Any]:
    """Export JOB's checkpoint (`checkpoint`: best, last or a step; default the newest) to JOB/export/model.onnx,
    check parity, write export.json; return it."""
    if exporter not in ("auto", "torchscript", "dynamo"):
        raise ConfigError(f"export: exporter {exporter!r}: use auto, torchscript or dynamo")
    if not 7 <= opset <= 23:
        raise ConfigError(f"export: opset {opset}: use 7..23 (17 is the default)")
    return export_loaded(load_job_model(Path(job_dir), checkpoint), opset, parity_inputs, exporter)


def export_loaded(job: JobModel, opset: int = DEFAULT_OPSET, parity_inputs: int = DEFAULT_PARITY_INPUTS,
                  exporter: str = "auto") -> dict[str, Any]:
    """`export_job` for a model already loaded (the evaluation step reuses its JobModel)."""
    t0 = time.perf_counter()
    plan = export_plan(job)
    if exporter in plan.unsupported:
        raise ConfigError(f"export: --exporter {exporter}: {plan.unsupported[exporter]}")
    exporters = plan.exporters if exporter == "auto" else [exporter]
    # Trace with 2 samples where the batch axis is symbolic: a batch of 1 lets the tracer bake in size-1 dims.
    example = plan.to_input(sample_batch(job.task, 2 if plan.dynamic_batch else 1))
    out_dir = job.job_dir / RUN_FILES.export
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{RUN_FILES.onnx}.{os.getpid()}.tmp"
    try:
        used = _export(plan, example, tmp, opset, exporters)
        recipe = inference_recipe(job)
        stamped = stamp_onnx(tmp, recipe)  # class names and preprocessing travel inside the file (metadata_props)
        inputs, outputs, real_opset = _graph_io(tmp, stamped)
        samples = _parity_batches(job, plan, max(1, parity_inputs))
        parity = check_parity(plan, tmp, samples, recipe.get("classes"), opset)
        if plan.compare == "detections" and parity.get("torch_detections", 0) == 0:
            extra = _all_scores_parity(plan, samples, opset, used, out_dir / f".probe.{os.getpid()}.tmp",
                                       recipe.get("classes"))
            if extra is not None:
                parity["all_scores"] = extra
                parity["ok"] = bool(parity["ok"] and extra["ok"])
                if not extra["ok"]:
                    parity["problem"] = f"with the score threshold at 0: {extra.get('problem', 'outputs differ')}"
                parity["note"] = ("no detection passed the score threshold on the parity inputs: the graph was "
                                  "also compared with the threshold at 0 (all_scores)")
        final = out_dir / (RUN_FILES.onnx if parity["ok"] else FAILED_FILE)
        os.replace(tmp, final)
    except BaseException:
        # An export that produced no graph leaves nothing behind: no temporary file, no empty export/.
        tmp.unlink(missing_ok=True)
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    import onnx
    import onnxruntime

    record = {
        "format": "onnx",
        "file": final.name,
        "sha256": file_sha256(final),
        "bytes": final.stat().st_size,
        "opset": real_opset,
        "exporter": used,
        "dynamic_batch": plan.dynamic_batch,
        "inputs": inputs,
        "outputs": outputs,
        "input_info": plan.input_info,
        "parity": parity,
        "job": job.spec.name,
        "task": job.spec.task,
        "model": job.spec.model,
        "checkpoint": str(job.checkpoint),
        "step": job.step,
        "classes": recipe["classes"],
        "recipe": recipe,
        "builder": model_recipe(job.task),  # as weights.json: musubi.tasks.rebuild.rebuild_model(builder)
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__},
        "created": dt.datetime.now(dt.timezone.utc).isoformat(),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if not parity["ok"]:
        # The earlier model.onnx/export.json (if any) stay: a bad export never replaces a good one.
        write_json(out_dir / FAILED_JSON, record)
        raise ParityError(
            f"{final}: ONNX Runtime disagrees with torch ({_parity_summary(parity)}); kept aside, every "
            f"difference and disagreement listed in {out_dir / FAILED_JSON} (parity)"
        )
    write_json(out_dir / RUN_FILES.export_record, record)
    return record


def _parity_summary(parity: dict[str, Any]) -> str:
    if "kinds" in parity:  # detections: the problem names the disagreements; then how many detections agree
        return (f"{parity.get('problem', 'outputs differ')}; {parity.get('exact', 0)} of "
                f"{parity.get('torch_detections', 0)} torch detections exact")
    keys = ("problem", "max_abs_diff", "max_box_diff_px", "max_score_diff", "unmatched")
    return ", ".join(f"{k} {parity[k]:.3g}" if isinstance(parity.get(k), float) else f"{k} {parity[k]}"
                     for k in keys if k in parity)
