"""Every exit code Musubi's processes use, in one table: what it means and whether it is tried again.

Three kinds of process end with these codes: a rank (`python -m musubi.worker.worker`, started by torchrun),
a command (`musubi ...`, the fleet's evaluation step `python -m musubi.fleet.eval_step`, a Slurm node's
`python -m musubi.fleet.slurm_node`), and the helpers they start (the all-reduce probe). Each code has one
meaning wherever it is used, so a reader of a code (goodput's post-mortem, the fleet's retry policy, a
script) never has to know which process wrote it. Negative codes are torchrun's way of saying "killed by
signal N" (`describe` names the signal). docs/reference/exit-codes.md shows this table
(tests/contract/test_exits.py keeps them equal).

`restarted`: the launcher tries again after it. For a rank, torchrun restarts every rank of the job (up to
`train.max_restarts`), and the restarted ranks recover (a smaller batch, a safer precision, the newest
checkpoint); a rank that ended for good (bad input, a defect) makes its restarted successor exit at once
with the same code. For a command, the fleet retries the job (up to the job's `retries`) unless the code
says the same input fails the same way again.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class ExitCode:
    """One exit code: its number, a name, what it means, and whether the launcher tries again after it."""

    code: int
    name: str
    meaning: str
    restarted: bool
    used_by: str  # "rank", "command" or "rank, command"


EXIT_OK = 0
#: A rank crashed (any exception without a recovery of its own), or a command's work ran and failed.
EXIT_FAILED = 1
#: Bad input, refused before anything started (`ConfigError`); a rank's: a problem found inside the workers.
EXIT_CONFIG = 2
#: The evaluation step of an external job that exited 0 without writing its eval.json (a broken contract).
EXIT_NO_RESULTS = 3
#: A rank hit an out-of-memory error (EX_TEMPFAIL: try again): every rank restarts at a smaller batch.
EXIT_OOM = 75
#: A non-finite loss: every rank restarts from the last good checkpoint in a safer precision (fp32: once more).
EXIT_NUMERICS = 76
#: The same failure struck twice in a row after restarts: a defect, not restarted again.
EXIT_DEFECT = 77
#: A rank's watchdog found the job hung (a peer stopped beating): every rank restarts.
EXIT_HANG = 78
#: The warm spare (launch/spare.py) ended under a process it had forked (a rank, torchrun's agent): the process
#: died with it; its client (contract/spare_client.py) exits with this. The launcher relaunches without a spare.
EXIT_SPARE_GONE = 79


def after_signal(signum: int) -> int:
    """The shell's code of a process that ended on signal `signum`: 128 + its number (SIGTERM: 143)."""
    return 128 + signum


#: `musubi train` stopped by Ctrl-C or SIGTERM (128 + SIGINT): the attempt is recorded as interrupted.
EXIT_INTERRUPTED = after_signal(signal.SIGINT)
#: A Slurm node's job stopped by SIGTERM (128 + SIGTERM: preemption, scancel); `musubi run` stopped by a signal
#: exits with after_signal(that signal).
EXIT_TERMINATED = after_signal(signal.SIGTERM)

EXITS: tuple[ExitCode, ...] = (
    ExitCode(EXIT_OK, "ok", "done, or nothing to do", False, "rank, command"),
    ExitCode(EXIT_FAILED, "failed", "a rank crashed; a command's work ran and failed, or a check failed", True,
             "rank, command"),
    ExitCode(EXIT_CONFIG, "config", "bad input, refused before anything started (one error line)", False,
             "rank, command"),
    ExitCode(EXIT_NO_RESULTS, "no_results", "an external job exited 0 without writing its eval.json", False,
             "command"),
    ExitCode(EXIT_OOM, "oom", "out of memory: every rank restarts at a smaller batch", True, "rank"),
    ExitCode(EXIT_NUMERICS, "numerics", "a non-finite loss: every rank restarts from the last good checkpoint in "
             "a safer precision (in fp32 once, ended if it repeats at the same step)", True, "rank"),
    ExitCode(EXIT_DEFECT, "defect", "the same failure struck again after a restart: no more restarts", False,
             "rank"),
    ExitCode(EXIT_HANG, "hang", "the watchdog found a peer stopped: every rank restarts", True, "rank"),
    ExitCode(EXIT_SPARE_GONE, "spare_gone", "the warm spare died under the rank or torchrun's agent it forked: "
             "the launcher relaunches once without it, from the newest committed checkpoint", True, "rank"),
    ExitCode(EXIT_INTERRUPTED, "interrupted", "`musubi train` stopped by Ctrl-C or SIGTERM; --resume continues",
             False, "command"),
    ExitCode(EXIT_TERMINATED, "terminated", "a Slurm node's job stopped by SIGTERM (preemption, scancel)", False,
             "command"),
)

BY_CODE: dict[int, ExitCode] = {e.code: e for e in EXITS}
#: A rank's error kind (logs/error-rank{r}.txt) that ends it for good: its restarted successor exits with this code.
FINAL_KINDS: dict[str, int] = {"config": EXIT_CONFIG, "defect": EXIT_DEFECT}


def describe(code: int) -> str:
    """A process's exit code in words: 'out of memory ...', 'killed by SIGKILL', or 'exit code N'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    known = BY_CODE.get(code)
    return known.name if known is not None else f"exit code {code}"


def restarted(code: int) -> bool:
    """Whether the launcher tries again after this exit (a signal: yes, a killed rank is a transient fault)."""
    if code < 0:
        return True
    known = BY_CODE.get(code)
    return known.restarted if known is not None else True
