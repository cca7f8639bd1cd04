"""A job's evaluation step, run by the fleet on the job's own GPUs: `python -m musubi.fleet.eval_step JOB_DIR`.

`--after FILE`: started early (while the job still trains), it imports torch and the evaluation code,
then waits for FILE (the fleet writes it when training ends well), so the ~4 s of Python start and
imports are off the critical path. It never touches CUDA before FILE exists, and it leaves when the
process that started it is gone. FILE's `"export": true` (the fleet's early export, in the tail of the
fleet) asks it to export the model to ONNX too; an export that fails is recorded and the job still ranks
(the fleet exports again when it ships).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from musubi.config.errors import ConfigError
from musubi.config.run_files import RUN_FILES
from musubi.store.startup import mark, wait_for_file


def wait_for(path: Path) -> bool:
    """Block until `path` exists (True), or until the parent process (the fleet) is gone (False)."""
    parent = os.getppid()
    return wait_for_file(path, lambda: os.getppid() == parent)


def asks_export(marker: Path) -> bool:
    """True when the fleet's trained marker asks for the model's export (an unreadable marker: no export)."""
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("export") is True


def main(argv: list[str] | None = None) -> int:
    """Evaluate one finished job (metrics, FPS by the documented protocol); exit 2 on bad input."""
    args = argv if argv is not None else sys.argv[1:]
    after = None
    if len(args) == 3 and args[0] == "--after":
        after, args = Path(args[1]), args[2:]
    if len(args) != 1:
        print("usage: python -m musubi.fleet.eval_step [--after FILE] JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(args[0])
    # Everything the evaluation imports, imported now (before the wait when started early): torch,
    # torchvision, the task registry, model loading, FPS timing and ONNX export. No CUDA call here.
    import torch  # noqa: F401
    import torchvision  # noqa: F401

    from musubi.evaluate import evaluate_job, fps, model_io, onnx_export  # noqa: F401
    from musubi.tasks import registry  # noqa: F401

    mark(job_dir, "eval_ready")
    if after is not None and not wait_for(after):
        print(f"error: the fleet left before {after} was written; nothing evaluated", file=sys.stderr)
        return 1
    if job_dir.is_dir() and not any((job_dir / f).is_file() for f in (RUN_FILES.job, RUN_FILES.eval,
                                                                         RUN_FILES.metrics_from)):
        from musubi.fleet.jobs import NO_EVAL_JSON

        print(f"error: external job {NO_EVAL_JSON} ({job_dir}): the program exited 0 without writing it; "
              "see the contract in the README", file=sys.stderr, flush=True)
        return 3
    export = after is not None and asks_export(after)
    try:
        try:
            result = evaluate_job(job_dir, export=export)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - an early export is an optimisation: never fail the job for it
            if not export:
                raise
            print(f"early export failed ({type(e).__name__}: {e}); evaluating without it", file=sys.stderr,
                  flush=True)
            result = evaluate_job(job_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mark(job_dir, "evaluated")
    print(json.dumps(result, default=str)[:2000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
