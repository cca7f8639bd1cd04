"""Rank-0 side effects: console, metrics.jsonl, TensorBoard, progress bar; per-rank log files.

Only rank 0 prints and writes shared files. Every rank (rank 0 included) also
logs to `logs/rank{r}.log`, so a problem on rank 3 is found in rank 3's file.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from musubi.contract.run_files import RUN_FILES
from musubi.contract.world import World

LOG_FORMAT = "%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s"


def setup_logging(world: World, logs_dir: Path) -> Console | None:
    """Route the `musubi` logger: rank 0 to the console and its file, others to their file only."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("musubi")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for h in list(logger.handlers):
        logger.removeHandler(h)
    from musubi.store.redact import ScrubFilter

    scrub = ScrubFilter()  # a secret variable's value never reaches a log file or the console
    fh = logging.FileHandler(logs_dir / f"rank{world.rank}.log", encoding="utf-8")
    fh.setFormatter(logging.Formatter(LOG_FORMAT.format(rank=world.rank)))
    fh.addFilter(scrub)
    logger.addHandler(fh)
    if not world.is_main:
        return None
    # Under a pipe (CI, a fleet's log file) rich would wrap at 80 columns: give it room.
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    rh = RichHandler(console=console, show_path=False, show_level=False, markup=False, log_time_format="[%X]")
    rh.setFormatter(logging.Formatter("%(message)s"))
    rh.addFilter(scrub)
    logger.addHandler(rh)
    return console


#: Log records `train.log_every: null` aims at over a run, and the interval it never exceeds (steps).
CURVE_POINTS = 20
LONGEST_LOG_INTERVAL = 10


def log_interval(total_steps: int) -> int:
    """`train.log_every` when left unset: a curve of CURVE_POINTS records on a short run, every 10 steps on a long
    one (a 16-step run logged once at the old fixed 10: a curve of one point)."""
    return max(1, min(LONGEST_LOG_INTERVAL, total_steps // CURVE_POINTS))


#: Console lines a short run prints in a pipe (CI, a log file) when `train.log_every` is unset, and the most
#: steps between two of them on a long run.
CONSOLE_LINES = 5
LONGEST_CONSOLE_INTERVAL = 50


def console_interval(total_steps: int, log_every: int) -> int:
    """Steps between the console's step lines in a pipe: about CONSOLE_LINES over a short run (its metrics.jsonl
    keeps the CURVE_POINTS records), one each LONGEST_CONSOLE_INTERVAL steps or so on a long one; a multiple of
    `log_every`, so every console line is a logged record."""
    wanted = min(-(-total_steps // CONSOLE_LINES), max(log_every, LONGEST_CONSOLE_INTERVAL))
    return log_every * max(1, wanted // log_every)


class MetricsWriter:
    """Rank 0's scalar sink: `metrics.jsonl` (one JSON object per line) and TensorBoard when installed."""

    def __init__(self, job_dir: Path, resume_step: int | None, tracking: Any = None, job_name: str = "job",
                 config: dict[str, Any] | None = None) -> None:
        self.path = job_dir / RUN_FILES.metrics
        if resume_step is not None and self.path.exists():
            # Entries past the checkpoint belong to a timeline that the resume discards.
            kept = [ln for ln in self.path.read_text(encoding="utf-8").splitlines()
                    if ln.strip() and json.loads(ln).get("step", 0) <= resume_step]
            self.path.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
        self._f = open(self.path, "a", encoding="utf-8")
        self._tb = None
        self._mlflow = None
        if tracking is None or tracking.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(job_dir / RUN_FILES.tensorboard), purge_step=resume_step)
            except ImportError:  # tensorboard is an optional extra
                self._tb = None
        if tracking is not None and tracking.mlflow:
            from musubi.store.tracking import MlflowSink

            self._mlflow = MlflowSink(job_dir, tracking, job_name, config or {})

    def write(self, step: int, values: dict[str, Any], kind: str = "train", at: float | None = None) -> None:
        """Append one record and mirror its numbers to TensorBoard. `at`: the record's time (time.time()) when
        it is not now (a log line is written an interval after its step: log_window.py)."""
        rec = {"step": step, "kind": kind, "time": round(time.time() if at is None else at, 3), **values}
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)
        if self._mlflow is not None:
            self._mlflow.write(step, values, kind)

    def close(self) -> None:
        """Flush and close both sinks."""
        self._f.close()
        if self._tb is not None:
            self._tb.close()
        if self._mlflow is not None:
            self._mlflow.close()


class ProgressBar:
    """Rank 0's bar: steps done, samples/s and ETA. A no-op elsewhere."""

    def __init__(self, console: Console | None, total_steps: int, done: int, desc: str) -> None:
        self._p: Progress | None = None
        if console is None:
            return
        self._p = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} samples/s"),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            refresh_per_second=4,
        )
        self._task = self._p.add_task(desc, total=total_steps, completed=done, rate="-", loss="-")
        self._p.start()

    def update(self, step: int) -> None:
        """Move the bar to `step`."""
        if self._p is not None:
            self._p.update(self._task, completed=step)

    def figures(self, samples_per_s: float, loss: float) -> None:
        """Show a log line's figures (the bar stays where it is)."""
        if self._p is not None:
            self._p.update(self._task, rate=f"{samples_per_s:,.1f}", loss=f"{loss:.4f}")

    def close(self) -> None:
        """Stop the live display."""
        if self._p is not None:
            self._p.stop()
