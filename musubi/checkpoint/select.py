"""Which committed checkpoint a command reads: `--checkpoint best|last|STEP`.

`last` is the newest intact one (a damaged newer one is skipped with a warning,
as a resume does); `best` the one whose COMMITTED marker holds the best value of
the validation metric (checkpoint.best_metric, else the task's primary metric)
recorded when it was saved; a number names a step. Every refusal is one line
that lists the steps there are.
"""

from __future__ import annotations

from pathlib import Path

from musubi.checkpoint.checkpoint import (
    Committed,
    best_checkpoint,
    committed_checkpoints,
    latest_checkpoint,
    verify,
)
from musubi.contract.errors import ConfigError

#: What `--checkpoint` takes besides a step number.
CHOICES = ("best", "last")


def check_choice(which: str | int | None) -> str:
    """`which` normalised ("last" for None); ConfigError for anything but best, last or a step number."""
    text = "last" if which is None else str(which).strip().lower()
    if text in CHOICES or (text.isdigit() and int(text) >= 0):
        return text
    raise ConfigError(f"--checkpoint {which!r}: give best, last or a step number (e.g. --checkpoint 120)")


def _steps(found: list[Committed]) -> str:
    steps = [str(c.step) for c in found]
    return ", ".join(steps[-12:]) if steps else "none"


def select_checkpoint(root: Path, which: str | int | None, metric: str | None, mode: str = "max",
                      checksums: bool = True) -> Committed:
    """The committed checkpoint under `root` that `which` names (best, last or a step); ConfigError naming the
    steps there are when there is none. `metric`/`mode` rank `best`; `checksums` also verifies SHA-256."""
    choice = check_choice(which)
    root = Path(root)
    if choice == "last":
        found = latest_checkpoint(root, checksums=checksums)
        if found is None:
            raise ConfigError(f"{root}: no committed checkpoint; train the job (checkpoint.enabled: true) first")
        return found
    committed = committed_checkpoints(root)
    if not committed:
        raise ConfigError(f"{root}: no committed checkpoint; train the job (checkpoint.enabled: true) first")
    if choice == "best":
        best = best_checkpoint(root, metric, mode)
        if best is None:
            raise ConfigError(
                f"--checkpoint best: no checkpoint of {root.parent.name} records a validation {metric or 'metric'} "
                f"(a checkpoint carries one when it is saved right after validation: set train.eval_every and "
                f"checkpoint.keep_best); use --checkpoint last or a step ({_steps(committed)})")
        chosen = best
    else:
        step = int(choice)
        chosen = next((c for c in committed if c.step == step), None)  # type: ignore[assignment]
        if chosen is None:
            raise ConfigError(f"--checkpoint {step}: {root.parent.name} has no committed checkpoint of step {step} "
                              f"(committed steps: {_steps(committed)})")
    if checksums:
        again = verify(chosen.path, checksums=True)
        if again is None:
            raise ConfigError(f"{chosen.path}: fails its SHA-256 check (damaged checkpoint); pick another step "
                              f"({_steps(committed)})")
        return again
    return chosen
