"""A job's evaluation step, run by the fleet on the job's own GPUs: `python -m musubi.fleet.eval_step JOB_DIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from musubi.config.errors import ConfigError
from musubi.config.run_files import RUN_FILES


def main(argv: list[str] | None = None) -> int:
    """Evaluate one finished job (metrics, FPS by the documented protocol); exit 2 on bad input."""
    from musubi.evaluate import evaluate_job

    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m musubi.fleet.eval_step JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(args[0])
    if job_dir.is_dir() and not any((job_dir / f).is_file() for f in (RUN_FILES.job, RUN_FILES.eval,
                                                                         RUN_FILES.metrics_from)):
        from musubi.fleet.jobs import NO_EVAL_JSON

        print(f"error: external job {NO_EVAL_JSON} ({job_dir}): the program exited 0 without writing it; "
              "see the contract in the README", file=sys.stderr, flush=True)
        return 3
    try:
        result = evaluate_job(job_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, default=str)[:2000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
