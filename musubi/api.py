"""The Python API: `musubi.train` and `musubi.run`, the two launching commands as functions,
`musubi.predict` (a trained, exported or registered model on images, folders, videos or arrays), and
`musubi.evaluate`, `musubi.export`, `musubi.load` (musubi/evaluate/python_api.py, re-exported here).

Each call does what the command line does (validation, preflight, torchrun, the
run checklist) and returns a `RunResult` read back from the run directory, so a
script sees the same figures as `musubi checklist`/`musubi leaderboard` later.
Bad input raises `ConfigError` (one line, nothing written), a failed preflight
`PreflightFailed`; a job that trained and failed is a result with `status`
"failed" and its `error`, as the command's exit code 1 is.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# committed.py reads markers without torch: a Python caller of musubi.train pays no torch import here (the
# launcher on CPU imports none either)
from musubi.checkpoint.committed import best_checkpoint, latest_checkpoint
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.evaluate.python_api import Exported, as_keywords, evaluate, export, load
from musubi.records.evidence import read_json_or_none
from musubi.store.rundir import read_jsonl


@dataclass(frozen=True)
class JobOutcome:
    """One trained job as its folder (RUN/JOB) records it."""

    name: str
    job_dir: Path
    status: str  # done | stopped (--max-steps) | failed | interrupted | queued (a fleet job never started)
    metrics: dict[str, Any] = field(default_factory=dict)  # eval.json's validation metrics (and fps, if measured)
    last_checkpoint: Path | None = None  # the newest committed checkpoint
    best_checkpoint: Path | None = None  # the committed one with the best `checkpoint.best_metric`, if scored
    error: str | None = None

    @property
    def history(self) -> list[dict[str, Any]]:
        """Rank 0's scalar records (metrics.jsonl): kind train (loss, lr, samples/s) and val, per step."""
        return read_jsonl(self.job_dir / RUN_FILES.metrics)  # a torn last line (a kill) is skipped


@dataclass(frozen=True)
class RunResult:
    """A run directory after `musubi.train` or `musubi.run`: every job's outcome and the checklist verdict."""

    run_dir: Path
    jobs: dict[str, JobOutcome]
    ok: bool  # every job done (or stopped by max_steps) and the run met its success criteria
    best: str | None = None  # the job ranked first (fleet leaderboard), or the only job

    @property
    def status(self) -> str:
        """The best job's status (the only job's, for `musubi.train`)."""
        return self._job().status

    @property
    def metrics(self) -> dict[str, Any]:
        """The best job's validation metrics."""
        return self._job().metrics

    @property
    def last_checkpoint(self) -> Path | None:
        """The best job's newest committed checkpoint."""
        return self._job().last_checkpoint

    @property
    def best_checkpoint(self) -> Path | None:
        """The best job's best-scoring committed checkpoint (None when no checkpoint holds a score)."""
        return self._job().best_checkpoint

    @property
    def error(self) -> str | None:
        """The first failed job's one-line error, or None."""
        return next((j.error for j in self.jobs.values() if j.error), None)

    def _job(self) -> JobOutcome:
        if self.best is None:
            raise ConfigError(f"{self.run_dir}: no job was trained; see result.jobs")
        return self.jobs[self.best]


def _flatten(overrides: Mapping[str, Any], prefix: str = "") -> list[str]:
    """{"train": {"lr": 0.1}} or {"train.lr": 0.1} -> ["train.lr=0.1"] (the CLI's --set; JSON is YAML)."""
    out = []
    for key, value in overrides.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out += _flatten(value, dotted + ".")
        else:
            out.append(f"{dotted}={json.dumps(value, default=str)}")
    return out


def job_outcome(job_dir: Path, status: str | None = None, error: str | None = None) -> JobOutcome:
    """What RUN/JOB holds: status (job.json unless given), eval metrics, last and best checkpoints."""
    record = read_json_or_none(job_dir / RUN_FILES.job) or {}
    ev = read_json_or_none(job_dir / RUN_FILES.eval) or {}
    metrics = dict(ev.get("metrics") or {}) if isinstance(ev, dict) else {}
    if isinstance(ev, dict) and isinstance(ev.get("fps"), dict) and "fps" in ev["fps"]:
        metrics["fps"] = ev["fps"]["fps"]
    ckpt = (record.get("config") or {}).get("checkpoint") or {}
    primary = ev.get("primary_metric") if isinstance(ev, dict) else None
    root = job_dir / RUN_FILES.checkpoints
    last = latest_checkpoint(root, warn=False)
    best = best_checkpoint(root, ckpt.get("best_metric") or primary, ckpt.get("best_mode", "max"))
    if error is None:
        error = next((h.get("error") for h in reversed(record.get("history") or []) if h.get("error")), None) \
            if record.get("status") not in ("done", "stopped") else None
    return JobOutcome(name=job_dir.name, job_dir=job_dir, status=status or record.get("status", "unknown"),
                      metrics=metrics, last_checkpoint=last.path if last else None,
                      best_checkpoint=best.path if best else None, error=error)


#: How an error line names a command-line option, and how a Python caller names it (same meaning).
FLAG_TO_KEYWORD = (
    ("--allow-changes ", "allow_changes="), ("--allow-changes", "allow_changes"), ("--oversubscribe", "oversubscribe=True"),
    ("--no-check", "check=False"), ("--max-steps ", "max_steps="), ("--max-steps", "max_steps"),
    ("--nproc ", "nproc="), ("--nproc", "nproc"), ("--out ", "out="), ("--out", "out"),
    ("--resume", "resume=True"), ("--device ", "device="), ("--device", "device"), ("--dry-run", "dry_run=True"),
    ("--set ", "the override "),
)
#: The job mapping's stand-in for a file name in error lines.
JOB_MAPPING = "musubi.train(job=<mapping>)"


def for_python(message: str, job_file: Path | None = None) -> str:
    """A refusal worded for a Python caller: keywords instead of the command line's flags, and the job mapping
    instead of the temporary file it was written to."""
    if job_file is not None:
        message = message.replace(str(job_file), JOB_MAPPING)
    for flag, keyword in FLAG_TO_KEYWORD:
        message = message.replace(flag, keyword)
    return message


def _job_file(job: str | Path | Mapping[str, Any], folder: str) -> Path:
    """The job YAML to launch: the given path, or a mapping written as NAME.yaml into `folder`."""
    if isinstance(job, Mapping):
        name = job.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError("musubi.train(dict): the job needs a name, e.g. {'name': 'mine', 'task': ...}")
        path = Path(folder) / f"{Path(name).name or 'job'}.yaml"
        path.write_text(yaml.safe_dump(dict(job), sort_keys=False), encoding="utf-8")
        return path
    return Path(job)


def check_override_keywords(overrides: Mapping[str, Any]) -> None:
    """An override keyword names a job section or a dotted field (train={...}, **{"train.lr": 0.1}); anything
    else is an unknown keyword of musubi.train, named as one (not as a job field)."""
    import difflib

    from musubi.config.job import JobSpec

    for key in overrides:
        if key.split(".")[0] not in JobSpec.model_fields:
            known = [*TRAIN_KEYWORDS, *JobSpec.model_fields]
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]}=?" if close else \
                f"keywords: {', '.join(TRAIN_KEYWORDS)}; job sections: {', '.join(JobSpec.model_fields)}"
            raise ConfigError(f"musubi.train(): unknown keyword {key!r}; {hint} (a job field goes in its section: "
                              "train={'epochs': 3} or **{'train.epochs': 3})")


#: musubi.train's own keywords (the rest are job overrides); tests/api compares them with `musubi train`'s options.
TRAIN_KEYWORDS = ("nproc", "out", "resume", "max_steps", "device", "check", "quiet", "dry_run", "oversubscribe",
                  "allow_changes")


def train(job: str | Path | Mapping[str, Any], *, nproc: int | None = None, out: str | Path | None = None,
          resume: bool = False, max_steps: int | None = None, device: str | None = None, check: bool = True,
          quiet: bool = False, dry_run: bool = False, oversubscribe: bool = False,
          allow_changes: Sequence[str] = (), **overrides: Any) -> RunResult | list[str]:
    """`musubi train`: train one job (a YAML path or a mapping) to the end; the run directory's outcome.

    Keyword overrides are the CLI's `key=value`: `train={"lr": 0.1}` or `**{"train.lr": 0.1}`. `dry_run=True`
    runs the launch's checks and returns the plan's lines (nothing started or written), as `--dry-run` prints
    them; `allow_changes=["train.lr"]` with `resume=True` lets the job differ from the recorded one there.
    """
    from musubi.launch.checks import dry_run_plan
    from musubi.launch.launch import launch_train
    from musubi.launch.request import PreflightFailed, TrainRequest

    if max_steps is not None and max_steps < 1:
        raise ConfigError(f"max_steps={max_steps}: must be >= 1")
    if allow_changes and not resume:
        raise ConfigError("allow_changes goes with resume=True (a new run records whatever job it is given)")
    check_override_keywords(overrides)
    sets = _flatten(overrides)
    with tempfile.TemporaryDirectory(prefix="musubi-job-") as folder:
        path = _job_file(job, folder)
        req = TrainRequest(job_path=path, nproc=nproc, out=Path(out) if out is not None else None, resume=resume,
                           max_steps=max_steps, overrides=sets, device=device, check=check, quiet=quiet,
                           oversubscribe=oversubscribe, allow_changes=list(allow_changes),
                           argv=["musubi.train", str(job if not isinstance(job, Mapping) else path), *sets])
        try:
            if dry_run:
                return dry_run_plan(req)
            result = launch_train(req)
        except ConfigError as e:
            raise ConfigError(for_python(str(e), path if isinstance(job, Mapping) else None)) from None
        except PreflightFailed as e:
            raise PreflightFailed(for_python(str(e))) from None
    outcome = job_outcome(result.job_dir, error=result.error if result.code else None)
    cl = build_checklist_of(result.run_dir)
    return RunResult(run_dir=result.run_dir, jobs={outcome.name: outcome}, best=outcome.name,
                     ok=result.code == 0 and cl.ok)


def build_checklist_of(run_dir: Path) -> Any:  # noqa: ANN401 - a Checklist
    """The run's checklist, written to RUN/checklist.json (as `musubi train` does at its end)."""
    from musubi.records.checklist import build_checklist, write_checklist

    cl = build_checklist(run_dir)
    write_checklist(run_dir, cl)
    return cl


def run(fleet: str | Path, *, out: str | Path | None = None, resume: bool = False, executor: str | None = None,
        cpu_slots: int | None = None, device: str | None = None, check: bool = True) -> RunResult:
    """`musubi run`: train, rank, export and register a whole fleet; every job's outcome, the best first."""
    from rich.console import Console

    from musubi.fleet.run import FleetRequest, run_fleet
    from musubi.records.checklist import build_checklist, write_checklist

    req = FleetRequest(fleet_path=Path(fleet), out=Path(out) if out is not None else None, resume=resume,
                       executor=executor, cpu_slots=cpu_slots, check=check, device=device)
    run_dir, states = run_fleet(req, Console())
    jobs = {}
    for name, s in states.items():
        err = "; ".join(s.causes) or None if s.state != "done" else None
        jobs[name] = job_outcome(run_dir / name, status=s.state, error=err)
    board = read_json_or_none(run_dir / RUN_FILES.leaderboard) or {}
    ranked = [r.get("job") for r in sorted(board.get("rows") or [], key=lambda r: r.get("rank") or 1e9)
              if r.get("rank") is not None and r.get("job") in jobs]
    cl = build_checklist(run_dir)
    write_checklist(run_dir, cl)
    done = [n for n, j in jobs.items() if j.status == "done"]
    best = ranked[0] if ranked else (done[0] if done else next(iter(jobs), None))
    return RunResult(run_dir=run_dir, jobs=dict(sorted(jobs.items(), key=lambda kv: kv[0] != best)), best=best,
                     ok=len(done) == len(jobs) and cl.ok)


#: musubi.predict's keywords: `musubi predict`'s options (tests/api/test_parity.py compares them).
PREDICT_KEYWORDS = ("out", "checkpoint", "conf", "save_images", "device", "db")


def predict(model: Any, source: Any, *, out: str | Path | None = None,  # noqa: ANN401 - a path, name or Predictor
            checkpoint: str | int = "last", conf: float | None = None, save_images: bool = False,
            device: str | None = None, db: str | Path | None = None) -> Any:
    """`musubi predict`: MODEL (job dir, .onnx/.pt export, registry NAME[:VERSION], or a model `musubi.load`
    returned) on SOURCE (image, folder, glob, video, a numpy array or a list); a PredictResult: per image boxes in
    file pixels, class names, and the COCO results rows (written to OUT/predictions.json when `out` is given)."""
    from musubi.evaluate.predict import predict as run

    try:
        return run(model, source, out=out, checkpoint=checkpoint, conf=conf, save_images=save_images,
                   device=device, db=db)
    except ConfigError as e:
        raise type(e)(as_keywords(str(e), PREDICT_KEYWORDS)) from None


__all__ = ["Exported", "JobOutcome", "RunResult", "evaluate", "export", "load", "predict", "run", "train"]
