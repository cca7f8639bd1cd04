"""The fleet's plan: the order of the queue and each moldable job's GPU count, chosen by predicted makespan.

Moldable-job scheduling is NP-hard; the known practical answer is two phases
(Turek, Wolf & Yu 1992; Ludwig & Tiwari 1994; Mounié, Rapine & Trystram 2007):
first choose each job's allotment (GPU count), then list-schedule the rigid
jobs that result. Here the list scheduler is the fleet's own packer
(fleet/packer.py), run on a virtual clock by `simulate`, so a plan is judged by
exactly the rules the fleet will follow (priority first, reservation,
backfill, `after:`). The candidates:

- as declared: the packer's own order, every job on its `gpus` (what the fleet
  did before plans; a plan is never predicted worse than this);
- longest first (LPT, Graham 1969) on the declared widths;
- moldable: every job on its fewest GPUs (side by side while there are more
  jobs than GPUs, where data parallelism loses nothing), longest first; then,
  while it shortens the predicted makespan, the jobs that end last are widened
  (the tail is where GPUs idle);
- the previous plan, continued (so re-planning after each job's end never
  predicts a longer fleet than the plan it replaces).

Priority and "previous best first" stay the first keys of every order; family
grouping is kept only by the declared candidate. Under a SharePolicy (fleet/sharing.py) every candidate is
judged with and without GPU sharing; sharing is kept only when it predicts a shorter makespan. On the
virtual clock a job beside others on one GPU progresses 1 + (their utilisation) times slower
(sharing.slowdown).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from musubi.fleet.packer import Demand, Packer, order
from musubi.fleet.sharing import SHARE_MARGIN, SharePolicy, slowdown

#: Above this many queued jobs only the declared and longest-first candidates are simulated (each widening
#: round simulates the whole queue again).
SEARCH_LIMIT = 200
#: Jobs at the end of the predicted schedule that a widening round tries (the tail, latest end first).
TAIL = 4


@dataclass(frozen=True)
class Bar:
    """One job on the predicted timeline: its GPUs and its predicted start and end (seconds from now)."""

    name: str
    gpus: tuple[int, ...]
    start: float
    end: float


@dataclass
class Plan:
    """The order to keep, the GPUs per job, and what the simulation predicts."""

    order: list[str]
    widths: dict[str, int]
    makespan: float
    bars: list[Bar] = field(default_factory=list)
    how: str = "declared"
    declared: float = 0.0  # the predicted makespan of the declared candidate (the packer without a plan)
    share: bool = False  # GPUs are shared under the fleet's SharePolicy (it predicted a shorter makespan)
    unshared: float = 0.0  # with `share`: the best predicted makespan without sharing


def simulate(gpus: Sequence[int], queue: Sequence[Demand], widths: Mapping[str, int],
             busy: Mapping[str, Sequence[int]] | None = None, remaining: Mapping[str, float] | None = None,
             done: Iterable[str] = (), topology=None, share: SharePolicy | None = None,
             running: Mapping[str, Demand] | None = None) -> list[Bar]:
    """The packer's schedule of `queue` (kept in this order, on `widths`) on a virtual clock, every job taking
    its predicted time (stretched while it shares a GPU); `busy`/`remaining`: jobs already running and the
    seconds they have left; `running`: what they asked (their utilisation, when they share); `share`: the
    policy under which GPUs may be shared (None: never)."""
    packer = Packer(list(gpus), list(queue), topology=topology, keep_order=True, width=dict(widths), share=share)
    held = {g for gs in (busy or {}).values() for g in gs}
    packer.free = [g for g in sorted(gpus) if g not in held]
    packer.busy = {n: list(g) for n, g in (busy or {}).items()}
    packer.running = {n: (running or {}).get(n) or Demand(n, len(g)) for n, g in packer.busy.items()}
    packer.done = set(done)
    return advance(packer, [0.0], dict(remaining or {}))


def advance(packer: Packer, clock: list[float], left: dict[str, float],
            placed: Callable[[Demand, list[int]], None] | None = None) -> list[Bar]:
    """Run `packer` on the virtual clock `clock` (its [0] is now, moved forward) until nothing more starts:
    place, then move to the next end. `left`: seconds of work each running job has left at full speed (new
    jobs get their prediction); a job progresses at 1/slowdown of the jobs on its GPUs (fleet/sharing.py).
    `placed(demand, gpus)` is called at each start. The bars of the jobs started, in start order."""
    bars: list[Bar] = []
    index: dict[str, int] = {}
    while True:
        for d, g in packer.place():
            if placed is not None:
                placed(d, g)
            seconds = d.predicted(len(g))
            left[d.name] = seconds if seconds is not None else 0.0
            index[d.name] = len(bars)
            bars.append(Bar(d.name, tuple(g), clock[0], clock[0]))
        live = [n for n in left if n in packer.busy]
        if not live:
            return bars  # what is still queued never starts (it waits for a job that is not coming)
        slow = {n: _slowdown(packer, n) for n in live}
        step = min(left[n] * slow[n] for n in live)
        clock[0] += step
        finished = []
        for n in live:
            left[n] -= step / slow[n]
            if left[n] <= 1e-9 * max(1.0, clock[0]):  # jobs ending together free their GPUs together
                finished.append(n)
        for n in finished:
            del left[n]
            if n in index:
                b = bars[index[n]]
                bars[index[n]] = Bar(b.name, b.gpus, b.start, clock[0])
            packer.release(n)
            packer.done.add(n)


def _slowdown(packer: Packer, name: str) -> float:
    """How much slower `name` runs now: 1 + the utilisation of the other jobs on its GPUs (1 alone on them), or
    what it measured while sharing before, when that is more."""
    gpus = set(packer.busy[name])
    others = [n for n, gs in packer.busy.items() if n != name and gpus & set(gs)]
    job = packer.running.get(name)
    return slowdown(((packer.running[n].util or 0.0) if n in packer.running else 0.0 for n in others),
                    job.shared_slowdown if job is not None else None)


def makespan(bars: Sequence[Bar], remaining: Mapping[str, float] | None = None) -> float:
    """The latest predicted end (running jobs included)."""
    return max([b.end for b in bars] + list((remaining or {}).values()) + [0.0])


def longest_first(queue: Sequence[Demand], widths: Mapping[str, int]) -> list[Demand]:
    """Previous best first, then priority, then longest predicted time on its width (LPT), then name."""
    return sorted(queue, key=lambda d: (not d.first, -d.priority, -(d.predicted(widths[d.name]) or 0.0), d.name))


def lower_bound(queue: Sequence[Demand], capacity: int) -> float:
    """No schedule ends sooner: the longest job on its best width, and the least GPU-seconds spread evenly."""
    if not queue or capacity < 1:
        return 0.0
    fits = [[(w, d.predicted(w) or 0.0) for w in d.allowed() if w <= capacity] for d in queue]
    longest = max(min(t for _, t in f) for f in fits if f)
    area = sum(min(w * t for w, t in f) for f in fits if f)
    return max(longest, area / capacity)


def best_plan(gpus: Sequence[int], queue: Sequence[Demand], busy: Mapping[str, Sequence[int]] | None = None,
              remaining: Mapping[str, float] | None = None, done: Iterable[str] = (),
              previous: Plan | None = None, share: SharePolicy | None = None,
              running: Mapping[str, Demand] | None = None) -> Plan:
    """The candidate plan with the shortest predicted makespan (ties: the previous plan, then as declared;
    then without sharing: GPUs are shared only when that predicts a fleet shorter by SHARE_MARGIN or more)."""
    sharable = share is not None and any(d.util is not None and 1 in d.allowed() for d in queue)
    plain = _best_plan(gpus, queue, busy, remaining, set(done), previous, None, running)
    if not sharable:
        return plain
    shared = _best_plan(gpus, queue, busy, remaining, set(done), previous, share, running)
    if shared.makespan < (1.0 - SHARE_MARGIN) * plain.makespan - 1e-6:
        shared.share, shared.unshared = True, plain.makespan
        return shared
    return plain


def _best_plan(gpus: Sequence[int], queue: Sequence[Demand], busy: Mapping[str, Sequence[int]] | None,
               remaining: Mapping[str, float] | None, done: set[str], previous: Plan | None,
               share: SharePolicy | None, running: Mapping[str, Demand] | None) -> Plan:
    """best_plan's candidates, all judged with sharing under `share` (None: never)."""
    capacity = len(gpus)

    def judge(ordered: list[Demand], widths: dict[str, int], how: str) -> Plan:
        bars = simulate(gpus, ordered, widths, busy, remaining, done, share=share, running=running)
        return Plan([d.name for d in ordered], dict(widths), makespan(bars, remaining), bars, how)

    declared_widths = {d.name: d.gpus for d in queue}
    plans: list[Plan] = []
    if previous is not None and all(n in previous.widths and previous.widths[n] in d.allowed()
                                    for d in queue for n in [d.name]):
        rank = {n: i for i, n in enumerate(previous.order)}
        plans.append(judge(sorted(queue, key=lambda d: rank.get(d.name, len(rank))),
                           {d.name: previous.widths[d.name] for d in queue}, previous.how))
    declared = judge(order(list(queue)), declared_widths, "declared")
    plans += [declared, judge(longest_first(queue, declared_widths), declared_widths, "longest first")]
    moldable = [d for d in queue if len([w for w in d.allowed() if w <= capacity]) > 1]
    if moldable and len(queue) <= SEARCH_LIMIT:
        plans.append(_widen(queue, capacity, judge))
    best = min(plans, key=lambda p: p.makespan)  # min keeps the first of equals
    best.declared = declared.makespan
    return best


def _widen(queue: Sequence[Demand], capacity: int, judge) -> Plan:
    """Every job on its fewest GPUs, longest first; then widen the jobs that end last while it pays."""
    widths = {d.name: min(d.allowed()) for d in queue}
    by_name = {d.name: d for d in queue}
    best = judge(longest_first(queue, widths), widths, "moldable")
    for _ in range(3 * len(queue)):
        better = None
        tail = sorted((b for b in best.bars if b.name in by_name), key=lambda b: -b.end)[:TAIL]
        for bar in tail:
            d = by_name[bar.name]
            for w in (w for w in d.allowed() if widths[d.name] < w <= capacity):
                trial = {**widths, d.name: w}
                plan = judge(longest_first(queue, trial), trial, "moldable")
                if plan.makespan < (better or best).makespan - 1e-9:
                    better, chosen = plan, trial
            if better is not None:
                break  # the latest-ending job that could be helped was; look at the new tail
        if better is None:
            return best
        best, widths = better, chosen
    return best
