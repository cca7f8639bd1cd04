"""A job's evaluation step, run by the fleet on the job's own GPUs: `python -m musubi.fleet.eval_step JOB_DIR`.

`--after FILE`: started early (while the job still trains), it imports torch and the evaluation code,
then waits for FILE (the fleet writes it when training ends well), so the ~4 s of Python start and
imports are off the critical path. It never touches CUDA before FILE exists, and it leaves when the
process that started it is gone. FILE's "export" (the fleet's early export, in the tail of the fleet:
its leaderboard settings, local.export_request) asks it to export the model to ONNX after evaluating it,
exactly as ship() would (export and parity, no ONNX Runtime timing), if the job ranks within the top-k
among the run's jobs evaluated so far. An export that fails is recorded and the job still ranks (the
fleet exports again when it ships).

`--external`: the fleet's job is an external command: its evaluation reads the eval.json (or the framework's files)
it wrote and times a model only where it left one, so the step imports neither torch nor the task registry up
front (~5 s of CPU a job; what a model timing needs is imported when it runs).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_NO_RESULTS, EXIT_OK
from musubi.contract.run_files import RUN_FILES
from musubi.evaluate.leaderboard import collect_jobs, rank_jobs
from musubi.evaluate.score import ScoreRule
from musubi.store.startup import EVAL_GPU_DONE, mark, wait_for_file


def wait_for(path: Path) -> bool:
    """Block until `path` exists (True), or until the parent process (the fleet) is gone (False)."""
    parent = os.getppid()
    return wait_for_file(path, lambda: os.getppid() == parent)


@dataclass(frozen=True)
class ExportAsk:
    """The fleet's early-export request: its top-k and how its leaderboard ranks jobs."""

    top: int
    rule: ScoreRule


def export_ask(marker: Path) -> ExportAsk | None:
    """The early-export request of the fleet's trained marker, or None (none asked, or unreadable: no export)."""
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
        ask = data["export"]
        if not ask:
            return None
        quality, fps = ask["weights"]
        return ExportAsk(int(ask["top"]), ScoreRule(float(quality), float(fps), ask["fps_target"],
                                                    float(ask["quality_floor"]), dict(ask.get("min_quality") or {})))
    except (OSError, ValueError, TypeError, KeyError, ConfigError) as e:
        print(f"no early export: {marker} holds no readable export request ({type(e).__name__}: {e})",
              file=sys.stderr, flush=True)
        return None


def ranks_for_export(job_dir: Path, ask: ExportAsk) -> tuple[bool, str]:
    """Whether the job ranks within the fleet's top-k among its run's jobs evaluated so far, and why in words.

    The leaderboard's own ranking (collect_jobs, rank_jobs; not build_leaderboard, which writes files).
    A heuristic: jobs evaluated later can move this one (the FPS normalisation follows the fleet's fastest
    job, the quality floor its best), so it may export a job that ends outside the top-k or skip one that
    ends inside it; ship() exports whatever the final top-k is, so correctness never depends on it. A
    fleet's last-ranked job, with only the top 1 shipped, has been exported early this way: its evaluation
    step ended the fleet (BENCHMARKS.md, fleet).
    """
    rows, _ = rank_jobs(collect_jobs(job_dir.parent), ask.rule)
    ranked = sum(r["rank"] is not None for r in rows)
    mine = next((r for r in rows if r["job"] == job_dir.name), None)
    if mine is None:
        return False, f"{job_dir.name} is not a job of {job_dir.parent}"
    if mine["rank"] is None:
        return False, f"not ranked among {ranked} evaluated ({mine['reason']})"
    where = f"rank {mine['rank']} of {ranked} evaluated, the fleet exports the top {ask.top}"
    return mine["rank"] <= ask.top, where


def export_if_ranked(job_dir: Path, ask: ExportAsk, loaded: Any = None) -> dict[str, Any] | None:
    """The early export of an evaluated job that ranks within the top-k so far: eval.json's "export" entry, or
    None when it did not export; one line says which and why. `loaded`: the JobModel its evaluation loaded
    (exported as it is, not read again from the checkpoint)."""
    from musubi.evaluate.job_eval import export_evaluated

    try:
        ranks, why = ranks_for_export(job_dir, ask)
    except ConfigError as e:
        ranks, why = False, f"the run's jobs could not be ranked ({e})"
    if not ranks:
        print(f"no early export: {why}", flush=True)
        return None
    try:
        entry = export_evaluated(job_dir, loaded)
    except Exception as e:  # noqa: BLE001 - an early export is an optimisation: never fail the job for it
        print(f"early export failed ({type(e).__name__}: {e}); ship() exports it if it ranks", file=sys.stderr,
              flush=True)
        return None
    print(f"early export ({why}): " + (f"failed, {entry['error']}" if "error" in entry else entry["file"]),
          flush=True)
    return entry


def step_args(args: list[str]) -> tuple[Path | None, bool, Path] | None:
    """(--after FILE or None, --external, JOB_DIR) of the step's command line; None when it is not one."""
    after, external = None, False
    while len(args) > 1 and args[0] in ("--after", "--external"):
        if args[0] == "--external":
            external, args = True, args[1:]
        elif len(args) > 2:
            after, args = Path(args[1]), args[2:]
        else:
            break
    if len(args) != 1 or args[0].startswith("--"):
        return None
    return after, external, Path(args[0])


def main(argv: list[str] | None = None) -> int:
    """Evaluate one finished job (metrics, FPS by the documented protocol); exit 2 on bad input."""
    parsed = step_args(list(argv if argv is not None else sys.argv[1:]))
    if parsed is None:
        print("usage: python -m musubi.fleet.eval_step [--after FILE] [--external] JOB_DIR", file=sys.stderr)
        return EXIT_CONFIG
    after, external, job_dir = parsed
    if not external:
        # Everything a task job's evaluation imports, imported now (before the wait when started early): torch,
        # torchvision, the task registry, model loading, FPS timing and ONNX export. No CUDA call here.
        import torch  # noqa: F401
        import torchvision  # noqa: F401

        from musubi.evaluate import evaluate_job, fps, model_io, onnx_export  # noqa: F401
        from musubi.tasks import registry  # noqa: F401

    mark(job_dir, "eval_ready")
    if after is not None and not wait_for(after):
        print(f"error: the fleet left before {after} was written; nothing evaluated", file=sys.stderr)
        return EXIT_FAILED
    if job_dir.is_dir() and not any((job_dir / f).is_file() for f in (RUN_FILES.job, RUN_FILES.eval,
                                                                         RUN_FILES.metrics_from)):
        from musubi.fleet.jobs import NO_EVAL_JSON

        print(f"error: external job {NO_EVAL_JSON} ({job_dir}): the program exited 0 without writing it; "
              "see the contract in the README", file=sys.stderr, flush=True)
        return EXIT_NO_RESULTS
    ask = export_ask(after) if after is not None else None
    held: list[Any] = []  # the model the evaluation loaded, for the early export below
    try:
        if external:  # what evaluate_job does for a job without a task config, without importing model loading
            from musubi.evaluate.job_eval import evaluate_external_job

            result = evaluate_external_job(job_dir, None, None, None)
        else:
            from musubi.evaluate import evaluate_job

            result = evaluate_job(job_dir, reached=lambda name: mark(job_dir, name), on_loaded=held.append)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    # The GPUs are no longer needed: the fleet lets the next job on them past its gate (or spawns it) now, and
    # an export below (ONNX on the CPU) runs beside that job's start instead of before it. What the model and
    # the FPS runs left in the caching allocator goes back to the GPU first: the next job builds its model and
    # probes its batch while this process may still export (only its CUDA context stays, until it exits).
    gc.collect()
    torch = sys.modules.get("torch")  # not imported by an external job's step unless its model timing needed it
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    mark(job_dir, EVAL_GPU_DONE)
    if ask is not None and result.get("kind") == "task":
        entry = export_if_ranked(job_dir, ask, held[0] if held else None)
        if entry is not None:
            result["export"] = entry
            mark(job_dir, "eval_exported")
    mark(job_dir, "evaluated")
    print(json.dumps(result, default=str)[:2000], flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
