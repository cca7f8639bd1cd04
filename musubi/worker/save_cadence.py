"""`checkpoint.every_steps: auto`, the rank's side: measure what a save costs, choose the interval, agree on it.

The rule is plan/cadence.py's (Daly's optimum interval between bounds). Its inputs, measured here by rank 0:

- delta, what one save costs training: the time the step was held by the save (Trainer.save: the wait for the
  previous save, staging to host memory, the agreement) plus the extra time of the steps that ran while the save
  was written in the background, each step's time over the median step without a save in flight, until rank 0
  committed it. The median of the last `RECENT` saves, carried across restarts in JOB/cadence.jsonl; before any,
  the first guess: the bytes of the parameters and optimizer state at `FIRST_GUESS_BYTES_PER_S`, or one step where
  that is longer;
- M, the job's mean time between faults: its attempts' history (recovery/fault_rate.py), else checkpoint.mtbf_s or
  Llama 3's rate for this many ranks;
- the step time (median of the recent steps without a save in flight) and the time a save takes to become durable.

Every rank must save at the same steps. They agree where they already meet: at each save (a collective) rank 0
broadcasts the next interval and every rank saves next at that step plus the interval. The first interval is
broadcast once, `PROBE_STEPS` after the fit started (those steps time the step). No step gains a collective.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from musubi.checkpoint.saver import Checkpointer
from musubi.config.job import CheckpointSpec
from musubi.contract.run_files import RUN_FILES
from musubi.contract.world import World, attempt_id
from musubi.plan.cadence import FIRST_GUESS_BYTES_PER_S, choose_every_steps, job_mtbf, prior_mtbf
from musubi.recovery.fault_rate import TAIL_BYTES, fault_history

log = logging.getLogger("musubi.checkpoint")

#: Steps timed after the fit's first (warm-up) step before the first interval is chosen.
PROBE_STEPS = 10
#: Saves whose median cost is delta (old ones forgotten: the machine's load changes).
RECENT = 5
#: A change of interval by this share of the last logged one is logged (smaller ones only go to cadence.jsonl).
LOG_CHANGE = 0.1
#: Recent steps without a save in flight whose median is the step time.
STEP_WINDOW = 50


def _median(values: Any) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the parameters and the optimizer's tensors (what a checkpoint copies)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for state in optimizer.state.values():
        total += sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
    return total


def recent_saves(path: Path) -> list[dict[str, Any]]:
    """The last `RECENT` saves measured in JOB/cadence.jsonl (`"event": "save"` lines of earlier attempts)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4 * TAIL_BYTES))
            raws = f.read().splitlines()
    except OSError:
        return []
    out = []
    for raw in raws:
        try:  # a line cut by a SIGKILL, or the first one cut by the seek, is skipped
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == "save":
            out.append(rec)
    return out[-RECENT:]


class AutoCadence:
    """One rank's auto cadence: `due(step)` says whether the agreed next save is reached; rank 0 measures and
    chooses, every rank takes rank 0's choice at `PROBE_STEPS` after the start and at each save."""

    def __init__(self, spec: CheckpointSpec, world: World, job_dir: Path, checkpointer: Checkpointer,
                 epoch_steps: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.spec, self.world, self.checkpointer = spec, world, checkpointer
        self.epoch_steps, self.model, self.optimizer = epoch_steps, model, optimizer
        self.path = job_dir / RUN_FILES.cadence
        self.next_step: int | None = None  # the agreed step of the next save; None: not chosen yet
        self.every: int | None = None
        self.probe_step = 0
        self.steps: deque[float] = deque(maxlen=STEP_WINDOW)  # seconds of steps without a save in flight
        self.costs: deque[float] = deque(maxlen=RECENT)  # delta of each measured save
        self.durables: deque[float] = deque(maxlen=RECENT)
        self.parts: deque[tuple[float, float]] = deque(maxlen=RECENT)  # (blocked, slowed) of each measured save
        self.pending: dict[str, Any] | None = None  # the save in flight being measured
        self.last_t: float | None = None
        self.clock = time.perf_counter  # seconds, monotonic (a test sets its own)
        self.t0 = time.time()
        self.history = None
        self.prior_s = spec.mtbf_s or prior_mtbf(world.size)
        if world.is_main:  # only rank 0 measures and chooses
            self.history = fault_history(job_dir, attempt_id())
            for s in recent_saves(self.path):  # what saves cost before a restart: the first guess no more
                self.costs.append(float(s["cost_s"]))
                self.durables.append(float(s["durable_s"]))
                self.parts.append((float(s["blocked_s"]), float(s["slowed_s"])))
        self.logged: dict[str, Any] | None = None  # the choice last logged

    # -- the trainer's events -------------------------------------------------------------------------
    def start(self, step: int) -> None:
        """The fit starts at `step`: the first interval is chosen PROBE_STEPS after its warm-up step."""
        self.probe_step = step + 1 + PROBE_STEPS
        self.last_t = None

    def step_end(self, step: int) -> None:
        """An optimizer step ended: time it (rank 0), and agree on the first interval at the probe step."""
        now = self.clock()
        if self.world.is_main and self.last_t is not None:
            self._timed(now - self.last_t, now)
        self.last_t = now
        if step == self.probe_step and self.next_step is None:
            self.agree(step)
            self.last_t = self.clock()

    def pause(self, _epoch: int = 0) -> None:
        """An epoch ended (its validation, its save): the next step's time starts afresh."""
        self.last_t = None

    def due(self, step: int) -> bool:
        """Whether the agreed next save is at (or before) `step`."""
        return self.next_step is not None and step >= self.next_step

    def saving(self, step: int) -> float:
        """A save of `step` starts (every rank); return its start (perf_counter)."""
        if self.world.is_main and self.pending is not None:  # the previous save is still being written: done now
            self._finish(self.clock(), ok=True)
        return self.clock()

    def saved(self, step: int, t_start: float) -> None:
        """The save of `step` returned (every rank): agree on the next interval; rank 0 starts measuring it."""
        self.agree(step)
        now = self.clock()
        if self.world.is_main and self.checkpointer.enabled:
            self.pending = {"step": step, "t0": t_start, "blocked_s": now - t_start, "slowed_s": 0.0}
            if self.checkpointer.inflight is None:  # synchronous: durable on return
                self._finish(now, ok=True)
        self.last_t = now

    # -- measuring (rank 0) ----------------------------------------------------------------------------
    def _timed(self, dt: float, now: float) -> None:
        p = self.pending
        if p is None:
            self.steps.append(dt)
            return
        base = _median(self.steps)
        if base is not None:
            p["slowed_s"] += max(0.0, dt - base)
        job = self.checkpointer.inflight
        if job is None or job.step != p["step"] or job.done:
            self._finish(now, ok=job is None or job.step != p["step"] or bool(job.done.get("ok")))

    def _finish(self, now: float, ok: bool) -> None:
        p, self.pending = self.pending, None
        if p is None or not ok:  # a failed save (a full disk) tells nothing of the next one's cost
            return
        cost, durable = p["blocked_s"] + p["slowed_s"], now - p["t0"]
        self.costs.append(cost)
        self.durables.append(durable)
        self.parts.append((p["blocked_s"], p["slowed_s"]))
        # written now, not at the next choice: a fault before it must not lose what this save cost
        self._append({"event": "save", "step": p["step"], "cost_s": round(cost, 4), "blocked_s": round(p["blocked_s"], 4),
                      "slowed_s": round(p["slowed_s"], 4), "durable_s": round(durable, 4), "time": round(time.time(), 3)})

    # -- choosing (rank 0) and agreeing (every rank) -----------------------------------------------------
    def agree(self, step: int) -> None:
        """Collective: rank 0 chooses the interval, every rank takes it; the next save is at step + interval."""
        choice = self.choose(step) if self.world.is_main else None
        every = int(self.world.broadcast_from_main([float(choice["every_steps"] if choice else 0)])[0])
        if every < 1:
            return  # no step time measured yet: chosen at the probe step or the next save
        self.next_step = step + every
        if self.world.is_main and choice is not None:
            self._record(choice)
        self.every = every

    def choose(self, step: int) -> dict[str, Any] | None:
        """Rank 0: the interval from what is measured now, with its inputs (a line of JOB/cadence.jsonl)."""
        step_s = _median(self.steps)
        if step_s is None or step_s <= 0:
            return None
        h = self.history
        start = h.current_start if h is not None and h.current_start is not None else self.t0
        exposure = (h.exposure_s if h is not None else 0.0) + max(0.0, time.time() - start)
        mtbf, mtbf_from = job_mtbf(self.prior_s, exposure, h.faults if h is not None else 0)
        if mtbf_from == "prior" and self.spec.mtbf_s:
            mtbf_from = "checkpoint.mtbf_s"
        if self.costs:
            delta = float(_median(self.costs))
            blocked, slowed = (float(_median(x)) for x in zip(*self.parts, strict=True))
            delta_from = f"median of {len(self.costs)} save(s): step blocked {blocked:.3f} s + slower steps " \
                         f"{slowed:.3f} s"
        else:
            guess = state_bytes(self.model, self.optimizer) / FIRST_GUESS_BYTES_PER_S
            delta = max(guess, step_s)
            delta_from = f"first guess: {'the state at 1 GB/s' if guess >= step_s else 'one step'}"
        durable = float(_median(self.durables) or 0.0)
        c = choose_every_steps(delta, mtbf, step_s, durable, self.spec.max_interval_s, self.epoch_steps)
        return {"event": "choice", "step": step, "every_steps": c.every_steps, "interval_s": round(c.every_steps * step_s, 3),
                "optimum_s": c.optimum_s, "bound": c.bound, "why": c.why, "save_cost_s": round(delta, 4),
                "save_cost_from": delta_from, "mtbf_s": round(mtbf, 1), "mtbf_from": mtbf_from,
                "step_s": round(step_s, 5), "durable_s": round(durable, 4), "saves": len(self.costs),
                "time": round(time.time(), 3)}

    def _append(self, rec: dict[str, Any]) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError as e:  # bookkeeping: the cadence holds without it
            log.info("cadence record not written: %s", e)

    def _record(self, choice: dict[str, Any]) -> None:
        """Rank 0: every choice to JOB/cadence.jsonl; a log line when the interval moved by `LOG_CHANGE` or more
        from the one last logged, or δ or M came from elsewhere (a first measure, the history's first fault)."""
        self._append(choice)
        last = self.logged
        if last is None or abs(choice["every_steps"] - last["every_steps"]) >= LOG_CHANGE * last["every_steps"] \
                or choice["save_cost_from"].split()[0] != last["save_cost_from"].split()[0] \
                or choice["mtbf_from"].split()[0] != last["mtbf_from"].split()[0]:
            self.logged = choice
            log.info("checkpoint cadence: every %d steps (%.1f s of training; Daly's optimum %.1f s%s) from "
                     "δ %.3f s per save (%s) and M %.0f s between faults (%s)", choice["every_steps"],
                     choice["interval_s"], choice["optimum_s"], f", {choice['why']}" if choice["why"] else "",
                     choice["save_cost_s"], choice["save_cost_from"], choice["mtbf_s"], choice["mtbf_from"])
