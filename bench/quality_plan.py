"""The quality bench's plan (bench/quality.py): its runs, each run's time, how they share the GPUs, and the
calibration of those times from an earlier result file.

A run's time with its GPU to itself is a start-up (process, imports, launcher, data sets, model; exit), not
slowed by other runs, then GPU work, steps x a step's seconds + validations x a validation's: the recipes'
figures, or those measured by an earlier call (`calibrate`). Runs sharing a GPU slow each other's GPU work
(SHARE_SLOWDOWN, processor sharing); `simulate` plays the list schedule that bench/quality.py runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import quality_data
from bench.quality_recipes import DATA_SCALES, Recipe

#: Slow-down of a run's GPU part for each other run past its start-up on its busiest GPU (planning only).
#: These models are launch-bound (one rank of the zoo's small detectors kept an H200 15-25 % busy, session 5),
#: so a few share a GPU, not for free. Checked on 2x H200 with bench/quality_plan.calibrate: calibrated from the
#: call 4 a GPU (2c8e561-wip), the plan predicts the 10 finished runs of the call 2 a GPU (6c906c8) within 10 %
#: (mean +2 %); 0.2 gives 13 % (mean +5 %), 0.3 gives 11 % (mean 0 %).
SHARE_SLOWDOWN = 0.25
#: Seconds before the first run starts (writing both data sets: 7 s on this 2-core machine) and after the
#: last ends (the report, the plot, the logs' archive), in the budget's plan.
SETUP_S, REPORT_S = 10.0, 10.0
#: Default --budget-s on GPUs: the data and every run (a device call lasts <= 10 minutes). The default plan on
#: 2 GPUs is estimated at 518 s of it (4 a GPU); the rest is room for the estimate's error, past which the last
#: runs are cut (reported, not judged) and a second call finishes them (--finish).
BUDGET_S = 540.0
#: Runs a GPU at once that the SHARE_SLOWDOWN rule was checked at (session 19); more is extrapolation.
MAX_PER_DEVICE = 4


# -- the runs and their plan --------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One training: a model, a side (plain | musubi), its ranks, a seed."""

    model: str
    side: str
    nproc: int
    seed: int

    @property
    def name(self) -> str:
        """The run's folder and label, e.g. detr-musubi4-s1."""
        return f"{self.model}-{self.side}{self.nproc if self.side == 'musubi' else ''}-s{self.seed}"


def plan_runs(models: list[str], seeds: list[int], nprocs: list[int]) -> list[Run]:
    """Every run: per model and seed, the plain loop and Musubi at each rank count."""
    return [Run(m, side, n, s) for m in models for s in seeds
            for side, n in [("plain", 1)] + [("musubi", n) for n in nprocs]]


def steps_of(recipe: Recipe, params: quality_data.DataParams, max_steps: int | None) -> int:
    """Optimizer steps of a run (the same on both sides: same global batch, last partial batch dropped)."""
    n = (params.train_scenes if recipe.task == "detection"
         else round(quality_data.DIGITS * (1 - params.val_fraction)))
    total = n // recipe.global_batch * recipe.epochs
    return min(total, max_steps) if max_steps else total


def evaluations(recipe: Recipe, steps: int, params: quality_data.DataParams) -> int:
    """Validations of a run: every `eval_every` epochs and at its end (Musubi's rule, the plain loop's too)."""
    per_epoch = max(1, (params.train_scenes if recipe.task == "detection"
                        else round(quality_data.DIGITS * (1 - params.val_fraction))) // recipe.global_batch)
    epochs = -(-steps // per_epoch)
    every = recipe.eval_every or recipe.epochs
    return epochs // every + (epochs % every != 0)


def step_s(recipe: Recipe, nproc: int) -> float:
    """Seconds of a step with the GPU to itself when the global batch is split over `nproc` ranks."""
    return recipe.gpu_step_s * (1 - recipe.gpu_image_share + recipe.gpu_image_share / nproc)


def estimate_s(run: Run, recipe: Recipe, steps: int, device: str, calibration: dict[str, Cost],
               params: quality_data.DataParams = DATA_SCALES["full"]) -> float:
    """Seconds the run takes with its GPU (or the CPU) to itself: from the costs an earlier call measured
    where known (scaled to this run's steps and validations), else the recipe's figures."""
    cost = calibration.get(config_key(run))
    if cost is not None:
        return cost.fixed_s + steps * cost.step_s + evaluations(recipe, steps, params) * cost.eval_s
    if device == "cpu":
        return (25.0 if run.side == "plain" else 55.0) + steps * recipe.cpu_step_s
    return (recipe.gpu_fixed_s[run.side] + steps * step_s(recipe, run.nproc)
            + evaluations(recipe, steps, params) * recipe.gpu_eval_s)


def first_fit(queue: list[Run], load: list[int], per_device: int, devices: int) -> Run | None:
    """The first queued run of the earliest seed not fully started that has a free slot on enough devices.
    Later seeds wait: backfilling them would starve a 4-GPU run (it needs a slot on every GPU at once) and
    leave a budget cut with whole seeds of one side missing."""
    free = sum(c < per_device for c in load)
    return next((r for r in queue if r.seed == queue[0].seed and free >= min(r.nproc, devices)), None)


def fixed_s(run: Run, recipe: Recipe, device: str, est: float, calibration: dict[str, Cost] | None = None) -> float:
    """The part of a run's estimate that does not share its GPU: start-up (imports, launcher, data, model) and
    exit, CPU work; measured where calibrated (see RECIPES for the runs the recipes' split was checked against)."""
    cost = (calibration or {}).get(config_key(run))
    if cost is not None:
        return min(est, cost.fixed_s)
    return min(est, 20.0 if device == "cpu" else recipe.gpu_fixed_s[run.side])


def simulate(runs: list[Run], est: dict[Run, float], devices: int, per_device: int,
             fixed: dict[Run, float] | None = None) -> tuple[float, list[Run], dict[Run, tuple[float, float]]]:
    """Makespan of list scheduling: runs in the given order, each started as soon as it has a free slot on
    `nproc` devices (the least loaded; on the CPU, the one device). A run first spends `fixed` seconds of
    its estimate starting (its slot taken, its GPU not), then the rest on the GPU, at 1 / (1 + SHARE_SLOWDOWN
    x (k - 1)) of its own speed while k runs past their start share its busiest device, k changing as runs
    start and end (processor sharing). Also the order runs would start in, and each run's (start, end)."""
    fixed = fixed or {}
    slots, busy = [0] * devices, [0] * devices
    running: dict[Run, list] = {}  # run -> [devices, start-up seconds left, GPU seconds left]
    now, started, queue = 0.0, [], list(runs)
    spans: dict[Run, tuple[float, float]] = {}
    while queue or running:
        while (fit := first_fit(queue, slots, per_device, devices)) is not None:
            devs = sorted(range(devices), key=lambda d: slots[d])[: min(fit.nproc, devices)]
            for d in devs:
                slots[d] += 1
            start = min(fixed.get(fit, 0.0), est[fit])
            running[fit] = [devs, start, est[fit] - start]
            if not start:
                for d in devs:
                    busy[d] += 1
            queue.remove(fit)
            started.append(fit)
            spans[fit] = (now, now)
        rate = {r: 1.0 if st > 0 else 1.0 / (1.0 + SHARE_SLOWDOWN * (max(busy[d] for d in devs) - 1))
                for r, (devs, st, _) in running.items()}
        dt = min((st if st > 0 else left / rate[r]) for r, (_, st, left) in running.items())
        now += dt
        for r, item in list(running.items()):
            devs, st, left = item
            if st > 0:
                item[1] = st - dt
                if item[1] <= 1e-9:
                    item[1] = 0.0
                    for d in devs:
                        busy[d] += 1
            else:
                item[2] = left - dt * rate[r]
            if item[1] == 0.0 and item[2] <= 1e-9:
                del running[r]
                spans[r] = (spans[r][0], now)
                for d in devs:
                    slots[d] -= 1
                    busy[d] -= 1
    return now, started, spans


def choose_per_device(runs: list[Run], est: dict[Run, float], devices: int, budget_s: float, max_per: int,
                      fixed: dict[Run, float] | None = None) -> tuple[int | None, dict[int, float]]:
    """The fewest processes a device whose simulated makespan fits the budget (None: none does), and the
    makespan of each tried."""
    tried = {}
    for k in range(1, max_per + 1):
        tried[k] = simulate(runs, est, devices, k, fixed)[0]
        if tried[k] <= budget_s:
            return k, tried
    return None, tried


def order_runs(runs: list[Run], est: dict[Run, float]) -> list[Run]:
    """Seed by seed (a budget cut then costs the last seed's runs, not one side's), and within a seed the
    widest first (they need every device at once), then the longest."""
    return sorted(runs, key=lambda r: (r.seed, -r.nproc, -est[r]))




# -- calibration: each configuration's costs, measured by an earlier call ------------------------------
@dataclass(frozen=True)
class Cost:
    """A configuration's seconds with its GPU to itself, measured: start-up and exit, a step, a validation."""

    fixed_s: float
    step_s: float
    eval_s: float


def config_key(run: Run) -> str:
    """What a calibration is kept by: model/side/nproc (a seed costs what another does)."""
    return f"{run.model}/{run.side}/{run.nproc}"


def run_of(record: dict[str, Any]) -> Run:
    """The run a result file's record is of."""
    return Run(record["model"], record["side"], record["nproc"], record["seed"])


def timeline(result: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Run name -> (start, end), seconds after the first start, of every run a result file started: its
    records' start_s where it has them, else replayed: the list schedule of its records, in their order (the
    order they were queued in), with their measured wall times. A replay that places a run on other devices
    or beside other runs than the record says is refused (the file was not scheduled as this bench does)."""
    if "merged_from" in result:
        raise ValueError("a merged result holds several calls' timelines: calibrate from one call's file")
    started = [r for r in result["records"] if r.get("wall_s", 0) > 0 or "start_s" in r]
    if started and all("start_s" in r for r in started):
        return {r["name"]: (r["start_s"], r["start_s"] + r["wall_s"]) for r in started}
    devices = 1 + max((d for r in started for d in r.get("devices") or [0]), default=0)
    per, wall = result["runs_per_device"], {r["name"]: r["wall_s"] for r in started}
    queue, slots, now = [run_of(r) for r in started], [0] * devices, 0.0
    placed = {r["name"]: (r.get("devices"), r.get("sharing")) for r in started}
    running: dict[Run, tuple[float, list[int]]] = {}  # run -> (start, devices)
    spans: dict[str, tuple[float, float]] = {}
    while queue or running:
        while (fit := first_fit(queue, slots, per, devices)) is not None:
            devs = sorted(range(devices), key=lambda d: slots[d])[: min(fit.nproc, devices)]
            if placed[fit.name][0] is not None and (devs, max(slots[d] for d in devs)) != placed[fit.name]:
                raise ValueError(f"{fit.name}: the replay puts it on devices {devs} beside "
                                 f"{max(slots[d] for d in devs)} runs, the record on {placed[fit.name][0]} beside "
                                 f"{placed[fit.name][1]}: this file cannot calibrate the plan")
            for d in devs:
                slots[d] += 1
            running[fit] = (now, devs)
            queue.remove(fit)
        done = min(running, key=lambda r: running[r][0] + wall[r.name])
        start, devs = running.pop(done)
        now = start + wall[done.name]
        spans[done.name] = (start, now)
        for d in devs:
            slots[d] -= 1
    return spans


def gpu_seconds(record: dict[str, Any], recipe: dict[str, Any]) -> float | None:
    """The part of a finished run's wall time past its start-up: Musubi's fit (steps and validations, its
    summary's train_s); the plain loop's training epochs plus its validations (eval_s where recorded, else the
    recipe's figure a validation). None for a run that did not finish."""
    if record.get("status") != "ok" or record.get("train_s") is None:
        return None
    gpu = record["train_s"]
    if record["side"] == "plain":
        measured = record.get("eval_s")
        gpu += measured if measured is not None else len(record.get("evals", [])) * recipe["gpu_eval_s"]
    return min(gpu, record["wall_s"])


def calibrate(result: dict[str, Any]) -> dict[str, Cost]:
    """Each configuration's costs with a GPU to itself, from an earlier call's result file: its start-up is
    its wall time less its GPU part; its GPU part is deflated by the sharing it met, second by second, on the
    file's timeline (SHARE_SLOWDOWN for each other run past its start-up on its busiest device), then split
    into validations (measured where the record has them) and steps. A mean over the configuration's runs."""
    recipes, spans = result["recipes"], timeline(result)
    records = [r for r in result["records"] if r["name"] in spans]
    gpu = {r["name"]: gpu_seconds(r, recipes[r["model"]]) for r in records}
    fixed_of: dict[str, list[float]] = {}
    for r in records:
        if gpu[r["name"]] is not None:
            fixed_of.setdefault(config_key(run_of(r)), []).append(r["wall_s"] - gpu[r["name"]])
    # Each run's GPU phase (start + its start-up .. end): a run cut or failed is assumed to have started like
    # the finished runs of its configuration (else as its recipe says).
    phase = {}
    for r in records:
        start, end = spans[r["name"]]
        f = fixed_of.get(config_key(run_of(r)))
        startup = (r["wall_s"] - gpu[r["name"]] if gpu[r["name"]] is not None else
                   sum(f) / len(f) if f else recipes[r["model"]]["gpu_fixed_s"][r["side"]])
        phase[r["name"]] = (min(start + startup, end), end, r.get("devices") or [0])
    costs: dict[str, list[Cost]] = {}
    for r in records:
        if gpu[r["name"]] is None or not r.get("steps"):
            continue
        alone = alone_seconds(phase[r["name"]], list(phase.values()))
        deflate = alone / max(gpu[r["name"]], 1e-9)
        evals = r.get("evals", [])
        measured = (r.get("eval_s") if r["side"] == "plain" else
                    sum(e["eval_s"] for e in evals) if evals and all("eval_s" in e for e in evals) else None)
        per_eval = (measured * deflate / len(evals) if measured is not None and evals else
                    recipes[r["model"]]["gpu_eval_s"])
        steps_part = max(0.0, alone - per_eval * len(evals))
        costs.setdefault(config_key(run_of(r)), []).append(
            Cost(r["wall_s"] - gpu[r["name"]], steps_part / r["steps"], per_eval))
    return {k: Cost(*(sum(getattr(c, f) for c in v) / len(v) for f in ("fixed_s", "step_s", "eval_s")))
            for k, v in costs.items()}


def alone_seconds(mine: tuple[float, float, list[int]], phases: list[tuple[float, float, list[int]]]) -> float:
    """Seconds a GPU phase (start, end, devices) would have taken with its devices to itself: the integral of
    its speed, 1 / (1 + SHARE_SLOWDOWN x (k - 1)) with k the GPU phases on its busiest device (its own among
    them), over its span."""
    start, end, devs = mine
    cuts = sorted({start, end, *(t for s, e, _ in phases for t in (s, e) if start < t < end)})
    total = 0.0
    for a, b in zip(cuts, cuts[1:], strict=False):
        mid = (a + b) / 2
        k = max(sum(1 for s, e, ds in phases if s <= mid < e and d in ds) for d in devs)
        total += (b - a) / (1.0 + SHARE_SLOWDOWN * (max(k, 1) - 1))
    return total


def read_calibration(path: Path | None) -> dict[str, Cost]:
    """model/side/nproc -> the costs measured by an earlier result file (`calibrate`); none without one."""
    if path is None:
        return {}
    return calibrate(json.loads(path.read_text()))


def replan(result: dict[str, Any], recipes: dict[str, Recipe], calibration: dict[str, Cost]) -> dict[str, tuple[float, float]]:
    """Run name -> the (start, end) this plan gives each run of an earlier call, had it planned that call: the
    file's runs in their order on its devices and runs a device, with `recipes`' costs (`calibration`'s where
    it has the configuration). Beside `timeline(result)`, how well the plan predicts a call."""
    runs = [run_of(r) for r in result["records"]]
    devices = 1 + max((d for r in result["records"] for d in r.get("devices") or [0]), default=0)
    params = quality_data.DataParams(**result["data"]["params"])
    est = {run: estimate_s(run, recipes[run.model], steps_of(recipes[run.model], params, result.get("max_steps")),
                           result["device"], calibration, params) for run in runs}
    fixed = {run: fixed_s(run, recipes[run.model], result["device"], est[run], calibration) for run in runs}
    spans = simulate(runs, est, devices, result["runs_per_device"], fixed)[2]
    return {run.name: spans[run] for run in runs}


def worst_error(result: dict[str, Any], predicted: dict[str, tuple[float, float]]) -> tuple[str, float]:
    """The finished run whose predicted wall time is furthest from its measured one: (name, predicted /
    measured - 1)."""
    errors = {r["name"]: (predicted[r["name"]][1] - predicted[r["name"]][0]) / r["wall_s"] - 1
              for r in result["records"] if r.get("status") == "ok" and r.get("wall_s")}
    name = max(errors, key=lambda k: abs(errors[k]))
    return name, errors[name]
