"""Metrics adapters: an external job's own framework files read into the eval.json contract (evaluate/external.py).

Declared on a command job as `metrics_from:` (config/fleet.py, MetricsFrom); the program is not edited:

- `ultralytics`: `results.csv` of a detection run (Ultralytics trainer.save_metrics: `epoch[,time],train/...,
  metrics/precision(B),metrics/recall(B),metrics/mAP50(B),metrics/mAP50-95(B),val/...,lr/pg0...`; columns padded
  with spaces before 8.1). The row `weights/best.pt` came from gives map50, map, precision and recall: the row
  whose mAP50 and mAP50-95 are best.pt's own `train_metrics` (read without running its code,
  ultralytics_weights.py), else the best row by the fitness rule of the Ultralytics that wrote it (FITNESS_RULES);
  best.pt is recorded, with its class names, input size and the Ultralytics version.
- `lightning`: CSVLogger `metrics.csv` (`epoch,step,<logged keys>`, one row per log call, empty cells where a
  key was not logged). Each column's last logged value.
- `hf-trainer`: Hugging Face Trainer `trainer_state.json` of the run's final state: the output folder's own (written
  by `trainer.save_state()`), else the checkpoint of the highest global step (a checkpoint's state ends at that
  checkpoint; a note says so when the run went on past it); its last `log_history` entry holding `eval_*` keys
  (runtime and throughput keys dropped). An `eval_results.json` (`trainer.save_metrics("eval", ...)`) beside the
  final state and newer than it is the run's last evaluation and wins. `best_model_checkpoint` is recorded.

`metrics` picks and renames metrics (Musubi name -> the framework's own name, e.g. `metrics/mAP50(B)`,
`eval_accuracy` or `accuracy`, a column of metrics.csv; a Musubi name such as `map50` also works), the first being
the primary metric. Every bad or missing file is one ConfigError line naming the file and the fix.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from musubi.contract.env import MUSUBI_JOB_DIR
from musubi.contract.errors import ConfigError

#: The file each format writes, searched under the job directory (or metrics_from.path).
FILES = {"ultralytics": "results.csv", "lightning": "metrics.csv", "hf-trainer": "trainer_state.json"}
#: Where each framework writes by default (shown in the fix when the file is missing).
DEFAULT_HINTS = {"ultralytics": "runs/detect/train (project/name)", "lightning": "lightning_logs/version_0 "
                 "(save_dir/name/version)", "hf-trainer": "the Trainer's output_dir (or a checkpoint-N folder)"}
#: Ultralytics' detection columns -> Musubi's names (map50 and map as the built-in detection task reports them).
ULTRALYTICS = {"map50": "metrics/mAP50(B)", "map": "metrics/mAP50-95(B)", "precision": "metrics/precision(B)",
               "recall": "metrics/recall(B)"}
#: Ultralytics' fitness weights on (mAP50, mAP50-95) by the version that picked best.pt (ultralytics/utils/metrics.py,
#: Metric.fitness, read in the released wheels): 0.1 mAP50 + 0.9 mAP50-95 up to 8.3.197, mAP50-95 alone from 8.3.198
#: on (8.4 included). Rows: (first version of the rule, weights, the rule in words).
FITNESS_RULES = (((0, 0, 0), (0.1, 0.9), "0.1 mAP50 + 0.9 mAP50-95"),
                 ((8, 3, 198), (0.0, 1.0), "mAP50-95 alone"))
#: A cell of results.csv is written "%.6g": a best.pt metric matches its row within this.
MATCH_TOLERANCE = 1e-5
#: HF Trainer eval keys that describe the evaluation run, not the model.
HF_NOT_METRICS = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "epoch", "step")
#: Largest metrics file read (a long run's CSV is a few MiB at most).
MAX_BYTES = 64 << 20


def find_file(job_dir: Path, fmt: str, path: str | None) -> Path:
    """The framework's file: under `path` (relative to the job directory) or, without it, the newest under the job
    (hf-trainer: the run's final state, final_hf_state)."""
    name = FILES[fmt]
    where = job_dir if path is None else (Path(path) if Path(path).is_absolute() else job_dir / path)
    if where.is_file():
        return where
    found = sorted(where.rglob(name), key=lambda p: p.stat().st_mtime) if where.is_dir() else []
    if found and fmt == "hf-trainer":
        return final_hf_state(found)
    if not found:
        raise ConfigError(f"{where}: no {name} under it (metrics_from: {fmt}); set metrics_from.path to the folder "
                          f"the program writes it to, e.g. {DEFAULT_HINTS[fmt]}, relative to ${MUSUBI_JOB_DIR}")
    return found[-1]  # several (checkpoint-N folders, versions): the newest is the run's latest word


def _text(path: Path) -> str:
    if path.stat().st_size > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES} bytes; point metrics_from.path at the run's own file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; give the file the framework wrote") from None


def _number(path: Path, where: str, column: str, cell: Any) -> float:
    try:
        value = float(cell)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: {where} {column} is {cell!r}, not a number; give the file the framework "
                          "wrote (not an edited copy)") from None
    if not math.isfinite(value):
        raise ConfigError(f"{path}: {where} {column} is {cell!r}; the run diverged, it has no score to rank")
    return value


def _rows(path: Path) -> list[dict[str, str]]:
    """CSV rows with names and cells stripped (Ultralytics before 8.1 padded both to 23 characters)."""
    reader = csv.DictReader(io.StringIO(_text(path)))
    if not reader.fieldnames:
        raise ConfigError(f"{path}: empty; the run wrote no epoch yet (did it finish?)")
    rows = [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in reader]
    if not rows:
        raise ConfigError(f"{path}: a header and no rows; the run finished no epoch")
    return rows


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """(8, 3, 198) of "8.3.198" (a suffix such as .dev0 ignored), or None when it is not a version."""
    parts = []
    for part in (version or "").split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) if parts else None


def fitness_rule(version: str | None, padded: bool) -> tuple[tuple[float, float], str]:
    """Ultralytics' fitness weights (mAP50, mAP50-95) and their words for the version that wrote the run.

    Unknown version: padded columns were written before 8.1 (the older rule), otherwise the current rule."""
    known = version_tuple(version)
    if known is None:
        known, said = ((8, 0, 0), "version unknown, padded columns: before 8.1") if padded else \
            ((99,), "version unknown (no readable best.pt): the current rule")
    else:
        said = f"Ultralytics {version}"
    rule = [r for r in FITNESS_RULES if known >= r[0]][-1]
    return rule[1], f"{rule[2]}, the fitness rule of {said}"


def _best_pt_row(values: list[dict[str, float]], saved: dict[str, float]) -> int | None:
    """The first row whose mAP50 and mAP50-95 are best.pt's own train_metrics, or None."""
    if not all(col in saved for col in (ULTRALYTICS["map50"], ULTRALYTICS["map"])):
        return None
    for i, row in enumerate(values):
        if all(abs(row[col] - saved[col]) <= MATCH_TOLERANCE for col in (ULTRALYTICS["map50"], ULTRALYTICS["map"])):
            return i
    return None


def read_ultralytics(path: Path) -> dict[str, Any]:
    """eval.json fields from an Ultralytics detection results.csv: the row of the epoch best.pt was saved at."""
    from musubi.evaluate.ultralytics_weights import read_weights

    text = _text(path)
    rows = _rows(path)
    missing = [c for c in ULTRALYTICS.values() if c not in rows[0]]
    if missing:
        raise ConfigError(f"{path}: no column {missing[0]} (has {', '.join(list(rows[0])[:6])}, ...); "
                          "metrics_from: ultralytics reads detection runs (task=detect)")
    # Every numeric cell of each row, under the framework's own column names (metrics_from.metrics may name them).
    values = [{col: _number(path, f"line {n + 2}", col, cell) for col, cell in row.items()
               if col in ULTRALYTICS.values() or (col not in ("epoch", "time") and _is_number(cell))}
              for n, row in enumerate(rows)]
    weights = path.parent / "weights" / "best.pt"
    facts = read_weights(weights) if weights.is_file() else None
    (w50, w5095), rule = fitness_rule(facts.version if facts else None, padded=text.startswith(" "))
    best = _best_pt_row(values, facts.train_metrics) if facts else None
    if best is not None:
        selected = f"the epoch best.pt was saved at (its own mAP50 and mAP50-95 match line {best + 2}; {rule})"
    else:
        best = max(range(len(rows)), key=lambda i: w50 * values[i][ULTRALYTICS["map50"]]
                   + w5095 * values[i][ULTRALYTICS["map"]])
        selected = f"best fitness ({rule})"
    framework = {"name": "ultralytics", "version": facts.version if facts else None}
    out: dict[str, Any] = {"metrics": {ours: values[best][col] for ours, col in ULTRALYTICS.items()},
                           "framework_metrics": values[best], "primary_metric": "map50", "framework": framework,
                           "source": {"format": "ultralytics", "file": str(path), "epoch": rows[best].get("epoch"),
                                      "epochs": len(rows), "selected": selected}}
    if weights.is_file():
        out["weights"] = str(weights.resolve())
    if facts is not None and facts.names:
        out["classes"] = facts.names  # names by class index, as the manifest carries a built-in job's
    if facts is not None and facts.imgsz is not None:
        out["input_size"] = facts.imgsz
    return out


def _is_number(cell: str) -> bool:
    try:
        return math.isfinite(float(cell))
    except ValueError:
        return False


def read_lightning(path: Path) -> dict[str, Any]:
    """eval.json fields from a Lightning CSVLogger metrics.csv: each column's last logged value."""
    rows = _rows(path)
    last: dict[str, float] = {}
    for n, row in enumerate(rows):
        for col, cell in row.items():
            if col in ("epoch", "step") or cell == "":
                continue  # an empty cell: that key was not logged in this call
            last[col] = _number(path, f"line {n + 2}", col, cell)
    if not last:
        raise ConfigError(f"{path}: no metric was logged (only epoch/step); log one with self.log in the module")
    epochs = [r["epoch"] for r in rows if r.get("epoch")]
    return {"metrics": last, "source": {"format": "lightning", "file": str(path),
                                        "epoch": epochs[-1] if epochs else None, "selected": "last logged values"}}


def _json(path: Path, what: str) -> Any:
    try:
        return json.loads(_text(path))
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON ({' '.join(str(e).split())[:80]}); give the file {what} "
                          "wrote") from None


def _checkpoint_folder(path: Path) -> Path | None:
    """The `checkpoint-N` folder holding a Trainer file, or None for a file of the output folder itself."""
    folder = path.parent
    name = folder.name
    return folder if name.startswith("checkpoint-") and name[len("checkpoint-"):].isdigit() else None


def _global_step(path: Path) -> int:
    try:
        step = json.loads(path.read_text(encoding="utf-8")).get("global_step")
    except (OSError, ValueError, AttributeError):
        return -1
    return step if isinstance(step, int) else -1


def final_hf_state(files: list[Path]) -> Path:
    """The run's final trainer_state.json among several: the output folder's own (trainer.save_state(), the newest
    if several runs wrote one), else the checkpoint of the highest global step (by its step, not its file time)."""
    final = [p for p in files if _checkpoint_folder(p) is None]
    if final:
        return max(final, key=lambda p: p.stat().st_mtime)
    return max(files, key=lambda p: (_global_step(p), p.stat().st_mtime))


def _final_eval(state_path: Path) -> Path | None:
    """eval_results.json of trainer.save_metrics("eval", ...) in the run's output folder, when it is newer than
    the state (the script's last evaluate()), else None."""
    checkpoint = _checkpoint_folder(state_path)
    out_dir = checkpoint.parent if checkpoint is not None else state_path.parent
    results = out_dir / "eval_results.json"
    if results.is_file() and results.stat().st_mtime >= state_path.stat().st_mtime:
        return results
    return None


def read_hf_trainer(path: Path) -> dict[str, Any]:
    """eval.json fields from a Hugging Face trainer_state.json: the run's last evaluation (see the module doc)."""
    state = _json(path, "the Trainer")
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise ConfigError(f"{path}: no log_history list; give the trainer_state.json a Trainer run wrote")
    evals = [e for e in history if isinstance(e, dict) and any(str(k).startswith("eval_") for k in e)]
    results = _final_eval(path)
    if not evals and results is None:
        raise ConfigError(f"{path}: log_history holds no evaluation (eval_* keys); train with eval_strategy "
                          "epoch or steps and an eval_dataset")
    if results is not None:
        entry = _json(results, "trainer.save_metrics")
        if not isinstance(entry, dict):
            raise ConfigError(f"{results}: not an object of eval_* metrics; give the file trainer.save_metrics wrote")
        entry = {**entry, "step": state.get("global_step")}
        source, selected = results, f"the run's last evaluation ({results.name}, newer than {path.name})"
    else:
        entry, source = evals[-1], path
        selected = "last evaluation in log_history of the " + (
            f"checkpoint {_checkpoint_folder(path).name}" if _checkpoint_folder(path) else "run's final state")
    metrics = {k: _number(source, f"log_history step {entry.get('step')}", k, v) for k, v in entry.items()
               if str(k).startswith("eval_") and k not in HF_NOT_METRICS}
    if not metrics:
        raise ConfigError(f"{source}: no eval_* metric in it; give the file the Trainer wrote")
    out: dict[str, Any] = {"metrics": metrics, "source": {"format": "hf-trainer", "file": str(source),
                                                          "step": entry.get("step"), "epoch": entry.get("epoch"),
                                                          "selected": selected}}
    step, last = state.get("global_step"), state.get("max_steps")
    if _checkpoint_folder(path) is not None and results is None:
        # Transformers 5.24 saves the last checkpoint before the final evaluation: even a checkpoint at the last
        # step lacks it (tests/evaluate/samples/hf-trainer-5.24).
        of = f" of {last}" if isinstance(last, int) else ""
        out["source"]["note"] = (f"no final state: the newest is checkpoint step {step}{of}, saved before any "
                                 "evaluation that followed it (the final one included); call trainer.save_state() "
                                 "after training so that the run's final state is read")
    if isinstance(state.get("best_model_checkpoint"), str):
        out["weights"] = state["best_model_checkpoint"]
    return out


READERS = {"ultralytics": read_ultralytics, "lightning": read_lightning, "hf-trainer": read_hf_trainer}


def adapt_metrics(job_dir: Path, fmt: str, path: str | None = None, rename: dict[str, str] | None = None) -> dict[str, Any]:
    """The eval.json an external job's framework files amount to (validated later as any eval.json is)."""
    if fmt not in READERS:
        raise ConfigError(f"metrics_from: unknown format {fmt!r}; give one of {', '.join(READERS)}")
    source = find_file(Path(job_dir), fmt, path)
    out = READERS[fmt](source)
    if rename:
        out["metrics"] = {ours: _pick(source, out, fmt, name) for ours, name in rename.items()}
        out["primary_metric"] = next(iter(rename))
    return out


def _pick(source: Path, adapted: dict[str, Any], fmt: str, name: str) -> float:
    """The value metrics_from.metrics names: the framework's own name (a results.csv column, an HF key with or
    without its eval_ prefix, a metrics.csv column), else a Musubi name the adapter gave (map50, ...)."""
    own = adapted.get("framework_metrics") or adapted["metrics"]
    for key in (name, f"eval_{name}" if fmt == "hf-trainer" else None):
        if key is not None and key in own:
            return own[key]
    if name in adapted["metrics"]:
        return adapted["metrics"][name]
    names = sorted(own) + sorted(set(adapted["metrics"]) - set(own))
    raise ConfigError(f"{source}: no metric {name!r} (has {', '.join(names[:12])}{', ...' if len(names) > 12 else ''});"
                      " fix metrics_from.metrics to name one of them")
