"""Metrics adapters: an external job's own framework files read into the eval.json contract (evaluate/external.py).

Declared on a command job as `metrics_from:` (config/fleet.py, MetricsFrom); the program is not edited:

- `ultralytics`: `results.csv` of a detection run (Ultralytics trainer.save_metrics: `epoch[,time],train/...,
  metrics/precision(B),metrics/recall(B),metrics/mAP50(B),metrics/mAP50-95(B),val/...,lr/pg0...`; columns padded
  with spaces before 8.1). The row of the best epoch by Ultralytics' own fitness (0.1 mAP50 + 0.9 mAP50-95,
  the rule that picked `weights/best.pt`) gives map50, map, precision and recall; best.pt is recorded.
- `lightning`: CSVLogger `metrics.csv` (`epoch,step,<logged keys>`, one row per log call, empty cells where a
  key was not logged). Each column's last logged value.
- `hf-trainer`: Hugging Face Trainer `trainer_state.json`: the last `log_history` entry holding `eval_*` keys
  (its runtime and throughput keys dropped); `best_model_checkpoint` is recorded.

`metrics` renames the framework's names to the ones the leaderboard compares (Musubi name -> column), the first
being the primary metric. Every bad or missing file is one ConfigError line naming the file and the fix.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError

#: The file each format writes, searched under the job directory (or metrics_from.path).
FILES = {"ultralytics": "results.csv", "lightning": "metrics.csv", "hf-trainer": "trainer_state.json"}
#: Where each framework writes by default (shown in the fix when the file is missing).
DEFAULT_HINTS = {"ultralytics": "runs/detect/train (project/name)", "lightning": "lightning_logs/version_0 "
                 "(save_dir/name/version)", "hf-trainer": "the Trainer's output_dir (or a checkpoint-N folder)"}
#: Ultralytics' detection columns -> Musubi's names (map50 and map as the built-in detection task reports them).
ULTRALYTICS = {"map50": "metrics/mAP50(B)", "map": "metrics/mAP50-95(B)", "precision": "metrics/precision(B)",
               "recall": "metrics/recall(B)"}
#: Ultralytics' fitness weights on mAP50 and mAP50-95 (ultralytics.utils.metrics.Metric.fitness).
FITNESS = (0.1, 0.9)
#: HF Trainer eval keys that describe the evaluation run, not the model.
HF_NOT_METRICS = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "epoch", "step")
#: Largest metrics file read (a long run's CSV is a few MiB at most).
MAX_BYTES = 64 << 20


def find_file(job_dir: Path, fmt: str, path: str | None) -> Path:
    """The framework's file: under `path` (relative to the job directory) or, without it, the newest under the job."""
    name = FILES[fmt]
    where = job_dir if path is None else (Path(path) if Path(path).is_absolute() else job_dir / path)
    if where.is_file():
        return where
    found = sorted(where.rglob(name), key=lambda p: p.stat().st_mtime) if where.is_dir() else []
    if not found:
        raise ConfigError(f"{where}: no {name} under it (metrics_from: {fmt}); set metrics_from.path to the folder "
                          f"the program writes it to, e.g. {DEFAULT_HINTS[fmt]}, relative to $MUSUBI_JOB_DIR")
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


def read_ultralytics(path: Path) -> dict[str, Any]:
    """eval.json fields from an Ultralytics detection results.csv (the best epoch by Ultralytics' fitness)."""
    rows = _rows(path)
    missing = [c for c in ULTRALYTICS.values() if c not in rows[0]]
    if missing:
        raise ConfigError(f"{path}: no column {missing[0]} (has {', '.join(list(rows[0])[:6])}, ...); "
                          "metrics_from: ultralytics reads detection runs (task=detect)")
    values = [{ours: _number(path, f"line {n + 2}", col, row[col]) for ours, col in ULTRALYTICS.items()}
              for n, row in enumerate(rows)]
    best = max(range(len(rows)), key=lambda i: FITNESS[0] * values[i]["map50"] + FITNESS[1] * values[i]["map"])
    out: dict[str, Any] = {"metrics": values[best], "primary_metric": "map50",
                           "source": {"format": "ultralytics", "file": str(path), "epoch": rows[best].get("epoch"),
                                      "epochs": len(rows), "selected": "best fitness (0.1 mAP50 + 0.9 mAP50-95)"}}
    weights = path.parent / "weights" / "best.pt"
    if weights.is_file():
        out["weights"] = str(weights)
    return out


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


def read_hf_trainer(path: Path) -> dict[str, Any]:
    """eval.json fields from a Hugging Face trainer_state.json: the last evaluation in log_history."""
    try:
        state = json.loads(_text(path))
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON ({' '.join(str(e).split())[:80]}); give the file the Trainer "
                          "wrote") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise ConfigError(f"{path}: no log_history list; give the trainer_state.json a Trainer run wrote")
    evals = [e for e in history if isinstance(e, dict) and any(str(k).startswith("eval_") for k in e)]
    if not evals:
        raise ConfigError(f"{path}: log_history holds no evaluation (eval_* keys); train with eval_strategy "
                          "epoch or steps and an eval_dataset")
    entry = evals[-1]
    metrics = {k: _number(path, f"log_history step {entry.get('step')}", k, v) for k, v in entry.items()
               if k.startswith("eval_") and k not in HF_NOT_METRICS}
    out: dict[str, Any] = {"metrics": metrics, "source": {"format": "hf-trainer", "file": str(path),
                                                          "step": entry.get("step"), "epoch": entry.get("epoch"),
                                                          "selected": "last evaluation in log_history"}}
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
        got = out["metrics"]
        absent = [col for col in rename.values() if col not in got]
        if absent:
            raise ConfigError(f"{source}: no metric {absent[0]!r} (has {', '.join(sorted(got)[:8])}); fix "
                              "metrics_from.metrics to name the framework's own keys")
        out["metrics"] = {ours: got[col] for ours, col in rename.items()}
        out["primary_metric"] = next(iter(rename))
    return out
