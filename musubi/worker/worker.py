"""Per-process entry point, started by torchrun: `python -m musubi.worker.worker JOB_DIR`.

A rank is set up, trains and finishes (worker/rank.py) inside one try: every way out is an exit
code the launcher reads (worker/exits.py). A `ConfigError` on any rank is written to
`JOB_DIR/logs/error-rank{r}.txt` and ends the rank with exit code 2, so the launcher can print
one line instead of a wall of tracebacks.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
from pathlib import Path

from musubi.contract.exits import EXIT_OK
from musubi.contract.spare_client import process_created
from musubi.store import startup
from musubi.worker.exits import RankEnd, crashed, refused_restart
from musubi.worker.pinning import pin_rank


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The rank's command line (torchrun passes the job directory; the launcher adds the flags)."""
    ap = argparse.ArgumentParser(prog="musubi-worker")
    ap.add_argument("job_dir", type=Path)
    ap.add_argument("--resume", action="store_true")
    # --resume of a run the launcher found no committed checkpoint for: the newest intact one if any, else step 0.
    ap.add_argument("--resume-if-any", action="store_true")
    ap.add_argument("--stop-at-step", type=int, default=None)
    ap.add_argument("--probe-only", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """Run one rank of a job; returns the process exit code. `started`: when the rank's process began (a rank
    forked by the launch's warm spare, worker/spare.py: its client's start), else this process's creation.

    The cyclic garbage collector is off from here until training starts, where fit() collects set-up's
    garbage, freezes what lives on and turns the collector back on (trainer.settle_heap). Set-up mostly creates
    objects that live on (torch's, DCP's and sympy's modules, torch._dynamo's, which DDP and every optimizer
    import, the model): collections along the way would walk them again and again and free little. The
    imports' objects are frozen as soon as they are in, so fit()'s first collection walks only set-up's own.
    A rank of the tiny test job spends less CPU time with the collector off, and less again with the imports
    frozen (BENCHMARKS.md, start-up). The batch probe still collects after each out-of-memory (autobatch.py).
    """
    gc.disable()
    try:
        return run(parse_args(argv), started)
    finally:
        gc.enable()


def run(args: argparse.Namespace, started: float | None = None) -> int:
    """One rank: setup -> train -> finish; a failure anywhere becomes its records and exit code."""
    rank = int(os.environ.get("RANK", "0"))
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    refused = refused_restart(args.job_dir, rank, restarts)  # torchrun restarts after any failure; some stay
    if refused is not None:
        return refused
    # First thing: every thread torch starts later, and every loader worker, inherits these cores.
    pinned = pin_rank(int(os.environ.get("LOCAL_RANK", "0")))
    t_start = time.time()
    if rank == 0:  # the one rank that writes the start-up marks (store/startup.py)
        startup.mark(args.job_dir, "worker", started if started is not None else process_created())
    job = None
    try:
        # torch and every module of the rank: after argument parsing (a fast --help) and the pinning
        from musubi.worker.rank import Rank

        gc.freeze()  # the modules just imported live as long as the process: no collection need walk them again
        job = Rank(args, rank, restarts, pinned, t_start)
        job.setup()
        job.train()
        job.finish()
    except RankEnd as end:  # a planned end before training: --probe-only, a repeated failure
        return end.code
    except Exception as e:
        return job.failed(e) if job is not None else crashed(args.job_dir, rank, e)
    else:
        return EXIT_OK


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is flushed and the process group is gone: skip interpreter teardown,
    # whose C++ destructors (gloo threads) were seen to abort a rank at exit, and on
    # failure a peer may be stuck in a collective; torchrun ends the others.
    os._exit(code)
