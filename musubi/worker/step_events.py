"""The named events of a rank's training step, and the hooks that listen to them.

The trainer's step says only what it does (forward, backward, optimizer) and announces where it
is; fault injection, the heartbeat and telemetry hang on these events instead of sitting inside
the step, and the trainer adds its own listeners for logging and checkpoint cadence (trainer.py).
Hooks of one event run in the order they were attached.

Events and their arguments (`step`: the optimizer step being computed, 1-based):

- `phase(name)`: the rank enters a phase: forward, backward, optimizer, between steps, log,
  eval, checkpoint, finish (the watchdog's progress signal; telemetry times some of them).
- `fit_start(step)`: training starts (or resumes) at `step`.
- `before_forward(step, batch)`: a micro-batch is about to run forward.
- `loss(loss, step)`: the micro-batch's loss before backward; a hook may return a replacement.
- `before_backward(step)` / `after_backward(step)`: around backward (`after_backward` also when
  backward raised, so a hook can undo what it set up).
- `before_optimizer(step)`: the optimizer is about to step.
- `step_end(step)`: optimizer step `step` is done.
- `epoch_end(epoch)`: an epoch (or the training inside one) ended, after its validation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from musubi.contract.inject import Injector, injected_oom
from musubi.recovery.watchdog import Heartbeat
from musubi.store.startup import mark
from musubi.telemetry.sections import BACKWARD, CHECKPOINT, EVAL, FORWARD, OPTIMIZER
from musubi.telemetry.spans import SpanRecorder

PHASE = "phase"
FIT_START = "fit_start"
BEFORE_FORWARD = "before_forward"
LOSS = "loss"
BEFORE_BACKWARD = "before_backward"
AFTER_BACKWARD = "after_backward"
BEFORE_OPTIMIZER = "before_optimizer"
STEP_END = "step_end"
EPOCH_END = "epoch_end"
EVENTS = (PHASE, FIT_START, BEFORE_FORWARD, LOSS, BEFORE_BACKWARD, AFTER_BACKWARD, BEFORE_OPTIMIZER, STEP_END,
          EPOCH_END)

#: The phase a rank is in after a step's hooks ran, until its next forward.
BETWEEN_STEPS = "between steps"
#: Phases that are telemetry sections too (a step's bookkeeping is the recorder's own `log` section).
TIMED_PHASES = frozenset({FORWARD, BACKWARD, OPTIMIZER, EVAL, CHECKPOINT})


class StepEvents:
    """Named events with their hooks, called in the order attached."""

    def __init__(self) -> None:
        self._hooks: dict[str, list[Callable[..., Any]]] = {name: [] for name in EVENTS}

    def on(self, event: str, hook: Callable[..., Any]) -> None:
        """Call `hook` with the event's arguments each time `event` fires."""
        if event not in self._hooks:
            raise ValueError(f"unknown step event {event!r}; known: {', '.join(EVENTS)}")
        self._hooks[event].append(hook)

    def off(self, event: str, hook: Callable[..., Any]) -> None:
        """Stop calling `hook` at `event` (a hook needed for a while only, e.g. the first step's marks). A new
        list, not an in-place removal: a hook may take itself off while its event's hooks are being run."""
        self._hooks[event] = [h for h in self._hooks[event] if h is not hook]

    def fire(self, event: str, *args: Any) -> None:
        """Run the hooks of `event`."""
        for hook in self._hooks[event]:
            hook(*args)

    def pipe(self, event: str, value: Any, *args: Any) -> Any:
        """Run the hooks of `event` on `value`; a hook returning something other than None replaces it."""
        for hook in self._hooks[event]:
            out = hook(value, *args)
            if out is not None:
                value = out
        return value


def attach_telemetry(events: StepEvents, tele: SpanRecorder) -> None:
    """Sections for the timed phases; a step record at each step end."""
    events.on(PHASE, lambda name: tele.section(name) if name in TIMED_PHASES else None)
    events.on(STEP_END, tele.step_done)


def attach_heartbeat(events: StepEvents, hb: Heartbeat) -> None:
    """Every phase beats; a step end moves the step (attached after telemetry: the step closes there first)."""
    events.on(PHASE, hb.beat)

    def stepped(step: int) -> None:
        hb.stepped(step)
        hb.beat(BETWEEN_STEPS)  # what the later hooks (faults, log, checkpoint) run in

    events.on(STEP_END, stepped)


class InjectionHooks:
    """`MUSUBI_INJECT` faults at the step's events (what each fault does: contract/inject.py)."""

    def __init__(self, injector: Injector, model: torch.nn.Module, device: torch.device,
                 batch_size_of: Callable[[Any], int]) -> None:
        self.injector, self.model, self.device, self.batch_size_of = injector, model, device, batch_size_of
        self._oom_hook: Any = None  # the gradient hook of a backward OOM, removed after backward
        self._t_step = time.perf_counter()

    def attach(self, events: StepEvents) -> None:
        """Listen to the step's events (attach only an injector that holds faults)."""
        events.on(FIT_START, self.fit_start)
        events.on(BEFORE_FORWARD, self.before_forward)
        events.on(LOSS, self.loss)
        events.on(BEFORE_BACKWARD, self.before_backward)
        events.on(AFTER_BACKWARD, self.after_backward)
        events.on(BEFORE_OPTIMIZER, self.before_optimizer)
        events.on(STEP_END, self.step_end)

    def fit_start(self, step: int) -> None:
        """Step times (the `slow` fault's reference) count from here."""
        self._t_step = time.perf_counter()

    def before_forward(self, step: int, batch: Any) -> None:
        """OOMs due in forward (also the simulated memory limit); data stalls are the feed's (before_batch)."""
        limit = self.injector.batch_limit()
        size = self.batch_size_of(batch)
        if limit is not None and size > limit:
            raise injected_oom(f"batch {size} > simulated limit {limit}")
        if self.injector.oom_phase(step, "forward"):
            raise injected_oom(f"forward, step {step}")

    def loss(self, loss: torch.Tensor, step: int) -> torch.Tensor | None:
        """`nan`: the numerical guard's drill."""
        return loss * float("nan") if self.injector.poison_loss(step) else None

    def before_backward(self, step: int) -> None:
        """`slow` (before the gradient sync), and a hook that raises OOM from inside autograd once the
        later layers' gradients went to DDP."""
        self.injector.slow_compute(self.device)
        if not self.injector.oom_phase(step, "backward"):
            return
        first = next(p for p in self.model.parameters() if p.requires_grad)

        def boom(grad: torch.Tensor) -> torch.Tensor:
            raise injected_oom(f"backward, step {step}")

        self._oom_hook = first.register_hook(boom)

    def after_backward(self, step: int) -> None:
        """Remove the OOM hook (also when backward raised)."""
        hook, self._oom_hook = self._oom_hook, None
        if hook is not None:
            hook.remove()

    def before_optimizer(self, step: int) -> None:
        """OOM due in the optimizer step."""
        if self.injector.oom_phase(step, "optimizer"):
            raise injected_oom(f"optimizer, step {step}")

    def step_end(self, step: int) -> None:
        """`slow` bookkeeping, then kill, crash and hang faults due after this step."""
        self.injector.after_step(step, time.perf_counter() - self._t_step)
        self._t_step = time.perf_counter()


class FirstStepMarks:
    """Start-up marks inside a fit's first optimizer step, on rank 0 (store/startup.py's FIRST_STEP).

    On a GPU the first step of a detector took an order of magnitude longer than a GPT's (BENCHMARKS.md,
    start-up); cudnn autotuning, lazy CUDA module loading and the loader's start are the suspects: these marks say
    which. Each waits for the device first (three synchronisations, in the first step only), so a mark is
    when that part's kernels finished, not when the host queued them; a mark is written once, at the first
    micro-batch, and the hooks take themselves off after the last one: the steps after pay nothing.
    """

    def __init__(self, job_dir: Path, device: torch.device, first_step: int) -> None:
        self.job_dir, self.device, self.first_step = job_dir, device, first_step
        self._hooks: list[tuple[str, Callable[..., Any]]] = [
            (BEFORE_FORWARD, lambda step, batch: self._mark("first_batch", step)),
            (LOSS, lambda loss, step: self._mark("first_forward", step)),
            (AFTER_BACKWARD, lambda step: self._mark("first_backward", step)),
        ]
        self._events: StepEvents | None = None

    def attach(self, events: StepEvents) -> None:
        self._events = events
        for event, hook in self._hooks:
            events.on(event, hook)

    def _mark(self, name: str, step: int) -> None:
        if step != self.first_step:
            return
        if self.device.type == "cuda":
            try:
                torch.cuda.synchronize(self.device)
            except RuntimeError:  # a failed backward (OOM) leaves its error to the step, not to a mark
                pass
        mark(self.job_dir, name)
        if name == "first_backward" and self._events is not None:  # the last part: off the hot path
            for event, hook in self._hooks:
                self._events.off(event, hook)
