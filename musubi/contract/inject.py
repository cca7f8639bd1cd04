"""Fault injection through one documented variable, `MUSUBI_INJECT` (tests, drills, benchmarks).

    MUSUBI_INJECT="oom:rank=1,step=5,phase=backward; slow:rank=2,factor=1.3; kill:rank=0,step=12;
                   hang:rank=1,step=8; data_stall:ms=200; ckpt_stall:ms=2000; ckpt_kill:step=10;
                   oom_above:rank=1,batch=24"

Kinds and their keys (rank defaults to every rank, step to any step):

- `oom`: raise a real `torch.OutOfMemoryError` at `phase` (forward, backward, optimizer) of
  optimizer step `step` (1-based). Backward faults fire from inside autograd, after the
  later layers' gradients were handed to DDP, as a real OOM would.
- `oom_above`: any forward with more than `batch` samples on that rank raises OOM (a
  simulated memory limit: the batch probe and the OOM guard see it like a real one).
- `slow`: stretch that rank's compute by `factor`: (factor - 1) x its recent step time of
  extra work inside backward, before the gradient sync (where a slower GPU loses its time):
  on a GPU real kernels (matrix products; a host sleep would hide in the launch queue's
  slack), on CPU a sleep.
- `kill`: SIGKILL the rank at `step`.   `hang`: stop the rank forever at `step`.
- `crash`: raise `InjectedCrash` (a RuntimeError) on the rank after optimizer step `step`: a defect
  of the code, the same exception at the same line each time. With `every=N` it strikes again
  after every restart that reaches the step (a repeated cause: see recovery/repeats.py).
- `data_stall`: delay every batch by `ms` (with `every=N`: every N-th batch only), inside the
  wait for the batch (the `data` section, before the host-to-device copy).
- `ckpt_stall`: delay each checkpoint by `ms`. `phase=block` (default): in the part of the save
  the training step waits for (a synchronous save; the staging of an asynchronous one), so the
  step sees the stall whatever `checkpoint.async_mode` is. `phase=write`: in the background
  write, before the commit (asynchronous saves: the step does not wait for it).
- `ckpt_kill`: SIGKILL the writer in the middle of the checkpoint of `step`. `phase=commit`
  (default): every shard is written, the rank dies before the marker (asynchronous saves: rank 0,
  the committer, dies in its commit thread). `phase=write`: the rank dies while writing its
  shards, leaving a truncated file behind.
- `nan`: make that rank's loss NaN at optimizer step `step` (the numerical guard's drill).
- `disk_full`: the checkpoint of `step` (default: the next one) fails on that rank as on a full
  disk: its shards are written, the first is cut in half, and the write raises `OSError` ENOSPC.
- `armed`: also take faults that a driver drops into the injector's folder while the job runs
  (`JOB/logs/inject/armed-N.txt`, N a number, one MUSUBI_INJECT spec each, written whole by a
  rename; bench/soak.py does this): each rank reads new files at its step ends, and a fault
  without `step` fires at its next chance (the next step; a checkpoint fault, the next save).

A fault fires once per run (also across restarts) unless `every=N` makes it fire on every
N-th step. An unknown kind or key is an error, not ignored.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from musubi.contract.env import MUSUBI_INJECT
from musubi.contract.errors import ConfigError

ENV = MUSUBI_INJECT  # the name the runtime reads (contract/env.py)
PHASES = ("forward", "backward", "optimizer")
SLOW_WARMUP = 3  # `slow` sizes its delay from step times after these steps
CKPT_PHASES = ("write", "commit")
STALL_PHASES = ("block", "write")
_KEYS: dict[str, set[str]] = {
    "oom": {"rank", "step", "phase", "every"},
    "oom_above": {"rank", "batch"},
    "slow": {"rank", "factor"},
    "kill": {"rank", "step", "every"},
    "hang": {"rank", "step", "every"},
    "crash": {"rank", "step", "every"},
    "data_stall": {"rank", "ms", "every"},
    "ckpt_stall": {"rank", "ms", "phase"},
    "ckpt_kill": {"rank", "step", "phase"},
    "nan": {"rank", "step", "every"},
    "disk_full": {"rank", "step"},
    "armed": set(),
}
#: Armed faults take indices from here on (file N's k-th fault: ARMED_INDEX + N * 100 + k), apart from the spec's.
ARMED_INDEX = 1_000_000
ARMED_PREFIX = "armed-"


class InjectedCrash(RuntimeError):
    """The exception of the `crash` fault (a stand-in for a bug that raises at the same place every time)."""


@dataclass(frozen=True)
class Fault:
    """One parsed fault: its kind, its parameters, and its position in the spec (its identity)."""

    kind: str
    params: dict[str, str] = field(hash=False)
    index: int = 0

    def num(self, key: str, default: float | None = None) -> float | None:
        """A numeric parameter."""
        raw = self.params.get(key)
        return default if raw is None else float(raw)

    def applies_to(self, rank: int) -> bool:
        """True when this fault targets `rank` (no `rank=` key: every rank)."""
        r = self.params.get("rank")
        return r is None or int(r) == rank


def parse(spec: str) -> list[Fault]:
    """Parse a MUSUBI_INJECT string; ConfigError on anything unknown or malformed."""
    faults: list[Fault] = []
    for i, part in enumerate(p.strip() for p in spec.split(";")):
        if not part:
            continue
        kind, _, rest = part.partition(":")
        kind = kind.strip()
        if kind not in _KEYS:
            raise ConfigError(f"{ENV}: unknown fault {kind!r}; known: {', '.join(sorted(_KEYS))}")
        params: dict[str, str] = {}
        for kv in (x.strip() for x in rest.split(",") if x.strip()):
            key, eq, value = kv.partition("=")
            key = key.strip()
            if not eq or key not in _KEYS[kind]:
                raise ConfigError(
                    f"{ENV}: {kind}: bad parameter {kv!r}; {kind} takes {', '.join(sorted(_KEYS[kind]))}"
                )
            params[key] = value.strip()
        for key, value in params.items():
            if key == "phase":
                allowed = {"ckpt_kill": CKPT_PHASES, "ckpt_stall": STALL_PHASES}.get(kind, PHASES)
                if value not in allowed:
                    raise ConfigError(f"{ENV}: {kind}: phase must be one of {', '.join(allowed)}, not {value!r}")
                continue
            try:
                float(value)
            except ValueError:
                raise ConfigError(f"{ENV}: {kind}: {key}={value!r} is not a number") from None
        if kind == "oom" and "phase" not in params:
            params["phase"] = "forward"
        if kind == "ckpt_kill" and "phase" not in params:
            params["phase"] = "commit"
        if kind == "ckpt_stall" and "phase" not in params:
            params["phase"] = "block"
        if kind == "oom_above" and "batch" not in params:
            raise ConfigError(f"{ENV}: oom_above needs batch=N (the largest batch that fits)")
        faults.append(Fault(kind, params, i))
    return faults


class Injector:
    """The faults of this rank, and the hooks the runtime calls at each point where one may fire."""

    def __init__(self, spec: str | None, rank: int, state_dir: Path | None) -> None:
        self.rank = rank
        self.state_dir = state_dir
        self.faults = [f for f in parse(spec or "") if f.applies_to(rank)]
        self._slow_ref_s: float | None = None  # this rank's recent step time without the injected work
        self._own_s: list[float] = []  # its last step times (warm-up steps left out)
        self._slept_s = 0.0
        self._batches = 0
        self._matmul: tuple[object, float] | None = None  # (operand, seconds per product) on this GPU
        self._armed = any(f.kind == "armed" for f in self.faults)
        self._armed_seen: set[str] = set()  # armed-N.txt files already read by this process

    @classmethod
    def from_env(cls, rank: int, state_dir: Path | None) -> Injector:
        """The injector described by MUSUBI_INJECT (empty when unset)."""
        return cls(os.environ.get(ENV), rank, state_dir)

    def __bool__(self) -> bool:
        return bool(self.faults)

    # -- once-per-run bookkeeping (survives restarts through a file per fault) --
    def _fired_path(self, f: Fault) -> Path | None:
        return None if self.state_dir is None else self.state_dir / f"fired-{f.index}-rank{self.rank}"

    def _due(self, f: Fault, step: int | None) -> bool:
        every = f.num("every")
        at = f.num("step")
        if every:
            return step is not None and step >= (at or every) and (step - (at or every)) % int(every) == 0
        if at is not None and step != int(at):
            return False
        p = self._fired_path(f)
        return p is None or not p.exists()

    def _mark(self, f: Fault, step: int | None = None) -> None:
        p = self._fired_path(f)
        if p is not None and not f.num("every"):
            p.parent.mkdir(parents=True, exist_ok=True)
            # When and where it fired: a driver (bench/soak.py) times the recovery from here.
            p.write_text(f"fired {f.kind} step={step} time={time.time():.3f}\n")

    def _of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    # -- hooks -------------------------------------------------------------
    def oom_phase(self, step: int, phase: str) -> bool:
        """True when an OOM must be raised now (and marks it fired)."""
        for f in self._of("oom"):
            if f.params["phase"] == phase and self._due(f, step):
                self._mark(f, step)
                return True
        return False

    def poison_loss(self, step: int) -> bool:
        """Whether this rank's loss of optimizer step `step` is to be made NaN (`nan` fault)."""
        for f in self._of("nan"):
            if self._due(f, step):
                self._mark(f, step)
                return True
        return False

    def batch_limit(self) -> int | None:
        """The simulated largest batch of this rank (`oom_above`), if any."""
        limits = [int(f.num("batch") or 0) for f in self._of("oom_above")]
        return min(limits) if limits else None

    def poll_armed(self) -> None:
        """`armed`: add the faults of armed-N.txt files not read yet (one directory listing; none without `armed`)."""
        if not self._armed or self.state_dir is None:
            return
        try:
            names = os.listdir(self.state_dir)
        except OSError:  # not created yet: nothing armed
            return
        for name in names:
            if not name.startswith(ARMED_PREFIX) or not name.endswith(".txt") or name in self._armed_seen:
                continue
            self._armed_seen.add(name)
            number = name[len(ARMED_PREFIX):-len(".txt")]
            if not number.isdigit():
                continue
            spec = (self.state_dir / name).read_text(encoding="utf-8")
            for f in parse(spec):  # an armed file with a bad spec fails the rank: a driver's bug, named
                if f.applies_to(self.rank):
                    self.faults.append(Fault(f.kind, f.params, ARMED_INDEX + int(number) * 100 + f.index))

    def after_step(self, step: int, step_seconds: float) -> None:
        """Slow bookkeeping, kill, crash and hang faults, after optimizer step `step`; then armed faults are read."""
        if self._of("slow"):
            own = max(0.0, step_seconds - self._slept_s)
            self._slept_s = 0.0
            if step > SLOW_WARMUP:  # the first steps (allocator, autotuning) would inflate the reference
                # The median of the last 5 steps: one noisy step must not make the next delay jump.
                self._own_s = [*self._own_s[-4:], own]
                self._slow_ref_s = sorted(self._own_s)[len(self._own_s) // 2]
        for f in self._of("kill"):
            if self._due(f, step):
                self._mark(f, step)
                os.kill(os.getpid(), signal.SIGKILL)
        for f in self._of("crash"):
            if self._due(f, step):
                self._mark(f, step)
                raise InjectedCrash(f"injected crash after step {step} by {ENV}")
        for f in self._of("hang"):
            if self._due(f, step):
                self._mark(f, step)
                while True:  # a rank that stops answering (the watchdog must notice)
                    time.sleep(3600)
        self.poll_armed()

    def slow_compute(self, device: object = None) -> None:
        """`slow`: (factor - 1) x the reference step time of extra work (called in backward)."""
        if self._slow_ref_s is None:
            return
        for f in self._of("slow"):
            pause = max(0.0, (f.num("factor", 1.0) or 1.0) - 1.0) * self._slow_ref_s
            if getattr(device, "type", "cpu") == "cuda":
                self._busy_gpu(pause, device)
            else:
                time.sleep(pause)
            self._slept_s += pause

    def _busy_gpu(self, seconds: float, device: object) -> None:
        """Queue about `seconds` of matrix products on the current stream (calibrated once, at first use)."""
        import torch

        if self._matmul is None:
            a = torch.randn(2048, 2048, device=device)
            for _ in range(3):
                torch.mm(a, a)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                torch.mm(a, a)
            end.record()
            end.synchronize()  # once per run, in a drill
            self._matmul = (a, max(start.elapsed_time(end) / 20 / 1e3, 1e-6))
        a, per = self._matmul
        # One timing is enough: re-timing each burst was tried and gave the same stretch (BENCHMARKS.md, fault
        # injection: `slow` on 4x H200).
        for _ in range(int(seconds / per)):
            torch.mm(a, a)

    def data_delay(self) -> None:
        """`data_stall`: delay a batch."""
        self._batches += 1
        for f in self._of("data_stall"):
            every = int(f.num("every", 1) or 1)
            if self._batches % every == 0:
                time.sleep((f.num("ms", 0.0) or 0.0) / 1000)

    def checkpoint_block(self, step: int) -> None:
        """`ckpt_stall` (phase block): called in the part of a save the training step waits for."""
        for f in self._of("ckpt_stall"):
            if f.params["phase"] == "block":
                time.sleep((f.num("ms", 0.0) or 0.0) / 1000)

    def checkpoint_write(self, step: int) -> None:
        """`ckpt_stall` (phase write) / `ckpt_kill` (phase commit): after the shards are written, before the commit."""
        for f in self._of("ckpt_stall"):
            if f.params["phase"] == "write":
                time.sleep((f.num("ms", 0.0) or 0.0) / 1000)
        for f in self._of("ckpt_kill"):
            if f.params["phase"] == "commit" and self._due(f, step):
                self._mark(f, step)
                os.kill(os.getpid(), signal.SIGKILL)

    def kill_while_writing(self, step: int) -> bool:
        """`ckpt_kill` (phase write) due at the checkpoint of `step` (marked fired now: the writer dies)."""
        for f in self._of("ckpt_kill"):
            if f.params["phase"] == "write" and self._due(f, step):
                self._mark(f, step)
                return True
        return False

    def disk_full_at(self, step: int) -> bool:
        """`disk_full` due at the checkpoint of `step` (marked fired now: this save fails)."""
        for f in self._of("disk_full"):
            if self._due(f, step):
                self._mark(f, step)
                return True
        return False


def injected_oom(where: str) -> BaseException:
    """A real torch OutOfMemoryError (the runtime cannot tell it from the allocator's)."""
    import torch

    err_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return err_type(f"injected OOM ({where}) by {ENV}")
