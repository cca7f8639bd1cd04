"""Straggler detection from per-rank step records: who is slow, in which section, and who arrives last.

Synchronous training makes every rank's step as long as the slowest one's, so
step times alone name no one. Two measurements do:

- *Local work before the sync* (data, h2d, forward, pre-sync backward,
  optimizer): each step, a rank's own time is compared with the other ranks'
  (their median: the fastest of many would make every rank look slow by the
  spread of the others), as a fraction of the step. Its *excess* is the median
  of that difference over all its local work, or in one section alone where
  that is larger (a neighbour's noise spread over other sections does not
  hide a lead in one); `section` is where most of it goes.
- *Last arrival* at the gradient all-reduce: the rank whose exposed
  `grad_comm` wait is shortest arrived last; the others' collectives look long
  because they wait for it.

The bar (`telemetry.straggler_threshold`, 5 % on GPUs): a rank is a straggler
when its median excess is at least that fraction of a step **and** it is
clearly above the run's own step-to-step noise: the sign test's lower
confidence bound of that median (ALPHA, distribution-free: at least the
binomial-critical count of the window's steps exceed the bar, not merely half
of them) reaches the bar too, and it arrived last in a clear majority of the
steps. A GPU 10 % slower in compute makes ~9 % of excess on a compute-bound
step and is flagged; a rank 5 % slower sits at the bar and is not reliably
flagged; a rank slower by the bar in only about half of its steps (a periodic
hiccup, the false alarm of a healthy 2-GPU run) is not flagged at all.

Live, the test runs on each WINDOW of steps and a rank is flagged after PERSIST
passing windows in a row that also pass over the last LONG steps (a burst of
noise is neither persistent nor present in the longer window): the earliest
flag of a rank slow from step 1 is step WARMUP + WINDOW + PERSIST - 1 = 29.
A flag clears after PERSIST windows whose median is back under the bar.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from musubi.telemetry.step_record import LOCAL_WORK, local_work_ms, sections_ms, wall_ms

WINDOW = 20  # steps in the sliding window of the live watch; fewer steady steps are not judged
WARMUP = 5  # first steps skipped (allocator, autotuning, bucket rebuild)
PERSIST = 5  # consecutive windows a rank must pass before the live watch flags it (or stay under to clear)
LONG = 2 * WINDOW  # the longer window a live flag must pass as well
#: One-sided level of the sign test (per window): in a 20-step window 14 steps must exceed the bar,
#: in a 40-step one 25, in a whole 55-step run 33. With PERSIST windows and the long one on top, noise
#: streams of 25 seeds never flag (tests/telemetry/test_straggler_noise.py); 0.05 flagged a 10 %-slower
#: rank under heavy noise later (27 of 30 seeds by step 50, against 28 of 30).
ALPHA = 0.1

#: Default bars (fraction of a step) when `telemetry.straggler_threshold` is not set. CPU ranks share
#: the host's cores and its scheduler: a healthy 2-rank job on 2 cores shows a few % of excess over a short
#: run, and the drill suite's sleep jitter reaches a few ms of a 33 ms step (BENCHMARKS.md, telemetry); 7 %
#: (the drills' calibrated bar) stays above that and still names a rank 10 % slower.
GPU_THRESHOLD = 0.05
CPU_THRESHOLD = 0.07


def default_threshold(configured: float | None, on_gpu: bool) -> float:
    """The straggler bar in force: the job's `telemetry.straggler_threshold`, else the device's default."""
    if configured is not None:
        return float(configured)
    return GPU_THRESHOLD if on_gpu else CPU_THRESHOLD


@dataclass
class StepView:
    """What the detector keeps of one step: per-rank work, sections, wall, last arriver, leads."""

    step: int
    wall: float
    work: dict[int, float]
    sections: dict[int, dict[str, float]]
    last: int | None
    walls: dict[int, float] | None = None  # each rank's own step wall time
    #: per rank: its extra time over the other ranks' median, as a fraction of the step, for all local
    #: work ("work") and each local section (computed once a step, not once a window)
    leads: dict[int, dict[str, float]] | None = None


def _lead(own: float, others: list[float], wall: float) -> float:
    """A rank's extra time over the other ranks' median, as a fraction of the step."""
    return (own - statistics.median(others)) / wall if others else 0.0


def view(step: int, recs: dict[int, dict[str, Any]]) -> StepView:
    """Reduce one aligned step (all ranks' records) to what the scores need."""
    comm = {r: sections_ms(x).get("grad_comm") for r, x in recs.items()}
    last = min(comm, key=lambda r: comm[r]) if len(recs) > 1 and all(v is not None for v in comm.values()) else None
    wall = max(wall_ms(x) for x in recs.values()) or 1e-9
    work = {r: local_work_ms(x) for r, x in recs.items()}
    sections = {r: sections_ms(x) for r, x in recs.items()}
    leads = {r: {"work": _lead(work[r], [w for q, w in work.items() if q != r], wall),
                 **{s: _lead(sections[r].get(s, 0.0), [x.get(s, 0.0) for q, x in sections.items() if q != r], wall)
                    for s in LOCAL_WORK}} for r in recs}
    return StepView(step=step, wall=wall, work=work, sections=sections, last=last,
                    walls={r: wall_ms(x) for r, x in recs.items()}, leads=leads)


@dataclass
class RankScore:
    """One rank's straggler figures over a span of steps."""

    rank: int
    excess: float  # median (time - the other ranks' median time) / step wall: all local work, or `section`
    section: str  # the local section with the largest median excess (where the extra time goes)
    work_excess: float  # the same over all local work together
    last_share: float | None  # fraction of steps where this rank arrived last at the gradient all-reduce
    history: float | None  # median work now / median work in the first window (1.0 = unchanged)
    flagged: bool  # over the bar, clearly above the noise (sign test) and arriving last
    flagged_at: int | None = None
    cv: float | None = None  # this rank's step-time coefficient of variation (after warm-up)
    p99_p50: float | None = None  # its p99 / median step time (the right tail pinning aims to narrow)
    excess_low: float | None = None  # lower (1 - ALPHA) confidence bound of `excess` (None: too few steps)
    over: bool = False  # median over the bar and arriving last, significant or not (what clearing looks at)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


def last_share_needed(world: int) -> float:
    """Share of last arrivals that singles a rank out (well above the 1/world of chance)."""
    return min(0.6, 1.2 / max(world, 1))


@functools.lru_cache(maxsize=256)
def sign_count(n: int, alpha: float = ALPHA) -> int | None:
    """Fewest of n steps that must exceed a value for the median to be above it at level `alpha` (sign test).

    None when even all n would not be significant (n < log2(1/alpha)). Exact, in integers (a long run's
    2**n is no float).
    """
    need, tail, limit = None, 0, Fraction(alpha) * 2 ** n
    for k in range(n, -1, -1):
        tail += math.comb(n, k)
        if tail > limit:
            break
        need = k
    return need


def median_low(xs: list[float], alpha: float = ALPHA) -> float | None:
    """Lower (1 - alpha) confidence bound of the median of xs: the sign_count-th largest value."""
    need = sign_count(len(xs), alpha)
    return None if need is None else sorted(xs)[len(xs) - need]


def tail(walls: list[float]) -> tuple[float | None, float | None]:
    """(coefficient of variation, p99/p50) of step times; None where there are too few (or zero) times."""
    walls = [w for w in walls if w > 0]
    if len(walls) < 2:
        return None, None
    mean, med = statistics.fmean(walls), statistics.median(walls)
    p99 = statistics.quantiles(walls, n=100, method="inclusive")[98]
    return round(statistics.pstdev(walls) / mean, 4), round(p99 / med, 4) if med else None


def score(views: list[StepView], threshold: float, baseline: dict[int, float] | None = None,
          tails: bool = False) -> list[RankScore]:
    """Scores of every rank over `views` (aligned steps, warm-up already dropped); `tails`: step-time CV, p99/p50."""
    if not views:
        return []
    ranks = sorted(views[0].work)
    need = last_share_needed(len(ranks))
    out = []
    with_last = [v for v in views if v.last is not None]
    for r in ranks:
        work = [v.leads[r]["work"] if v.leads else 0.0 for v in views]
        per_step = {s: [v.leads[r][s] if v.leads else 0.0 for v in views] for s in LOCAL_WORK}
        per_section = {s: statistics.median(xs) for s, xs in per_step.items()}
        section = max(per_section, key=lambda s: per_section[s])
        work_excess = statistics.median(work)
        # The figure tested: all local work (a slower GPU spreads over forward and backward), or the one
        # section where that is larger.
        tested = work if work_excess >= per_section[section] else per_step[section]
        excess = max(work_excess, per_section[section])
        low = median_low(tested)
        share = (sum(1 for v in with_last if v.last == r) / len(with_last)) if with_last else None
        work_now = statistics.median(v.work[r] for v in views)
        hist = work_now / baseline[r] if baseline and baseline.get(r) else None
        cv, p99_p50 = tail([v.walls[r] for v in views if v.walls and r in v.walls]) if tails else (None, None)
        over = len(ranks) > 1 and excess >= threshold and (share is None or share >= need)
        flagged = over and low is not None and low >= threshold
        out.append(RankScore(rank=r, excess=round(excess, 4), section=section, work_excess=round(work_excess, 4),
                             last_share=None if share is None else round(share, 3),
                             history=None if hist is None else round(hist, 3), flagged=flagged,
                             cv=cv, p99_p50=p99_p50, excess_low=None if low is None else round(low, 4), over=over))
    return out


class StragglerDetector:
    """Streaming detection over a sliding window; `update` returns the ranks newly flagged."""

    def __init__(self, threshold: float = 0.05, window: int = WINDOW, warmup: int = WARMUP,
                 long: int = LONG) -> None:
        self.threshold, self.window, self.warmup = threshold, window, warmup
        self.views: deque[StepView] = deque(maxlen=max(window, long))
        self.baseline: dict[int, float] | None = None
        self.active: set[int] = set()
        self.first_flag: dict[int, RankScore] = {}
        self.streak: dict[int, int] = {}
        self.windows = 0  # windows scored so far
        self.flagged_windows: dict[int, int] = {}  # per rank: windows in which it passed the test
        self.clean: dict[int, int] = {}  # per rank: windows in a row with its median under the bar
        self.cleared_now: list[int] = []  # flagged ranks back under the bar for PERSIST windows (last update)
        self.latest: dict[int, RankScore] = {}  # per rank: its scores over the last window scored
        self.scored_at: int | None = None  # the last step of that window

    def update(self, step: int, recs: dict[int, dict[str, Any]]) -> list[RankScore]:
        """Feed one aligned step; the scores of ranks that became flagged at this step."""
        if step <= self.warmup or len(recs) < 2:
            return []
        self.views.append(view(step, recs))
        if len(self.views) < self.window:
            return []
        held = list(self.views)
        views = held[-self.window:]
        if self.baseline is None:
            self.baseline = {r: statistics.median(v.work[r] for v in views) for r in views[0].work}
        new = []
        self.cleared_now = []
        self.windows += 1
        self.scored_at = step
        scores = score(views, self.threshold, self.baseline)
        # Both windows must pass: a burst that fills one short window is not in the longer one.
        longer = self._longer_window(held, scores)
        for s in scores:
            s.flagged = s.flagged and (longer is None or longer[s.rank].flagged)
            self.latest[s.rank] = s
            self.streak[s.rank] = self.streak.get(s.rank, 0) + 1 if s.flagged else 0
            self.clean[s.rank] = 0 if s.over else self.clean.get(s.rank, 0) + 1
            self.flagged_windows[s.rank] = self.flagged_windows.get(s.rank, 0) + int(s.flagged)
            if s.flagged and self.streak[s.rank] >= PERSIST and s.rank not in self.active:
                s.flagged_at = step
                self.active.add(s.rank)
                self.first_flag.setdefault(s.rank, s)
                new.append(s)
            elif s.rank in self.active and self.clean[s.rank] >= PERSIST:
                # Cleared as it was flagged: PERSIST windows in a row (one quiet window does not end a flag).
                self.active.discard(s.rank)
                self.cleared_now.append(s.rank)
        return new

    def _longer_window(self, held: list[StepView], scores: list[RankScore]) -> dict[int, RankScore] | None:
        """Every rank's scores over all the steps held, when they can confirm a flag of the short window; None
        when there is no longer window yet or nothing to confirm. Scored only when the short window flags a rank:
        it decides nothing else, and scoring it every step doubled the watch's Python on rank 0, GIL time its
        training thread may wait for (BENCHMARKS.md, telemetry)."""
        if len(held) <= self.window or not any(s.flagged for s in scores):
            return None
        return {s.rank: s for s in score(held, self.threshold)}


def detect(aligned: list[tuple[int, dict[int, dict]]], threshold: float, window: int = WINDOW,
           warmup: int = WARMUP) -> dict[str, Any]:
    """Offline: scores over all steps, and the streaming detector's view of the same steps.

    A rank is a straggler when its whole-span scores pass the test, or when the
    streaming detector flagged it and it passed in at least a quarter of the
    windows (a rank slow for part of the run is still named; the live flag's
    own test already asks for persistence and significance).
    """
    live = StragglerDetector(threshold, window, warmup)
    for step, recs in aligned:
        live.update(step, recs)
    views = [view(k, recs) for k, recs in aligned if k > warmup and len(recs) > 1]
    base = None
    if len(views) >= window:
        base = {r: statistics.median(v.work[r] for v in views[:window]) for r in views[0].work}
    scores = score(views, threshold, base, tails=True)
    for s in scores:
        first = live.first_flag.get(s.rank)
        s.flagged_at = first.flagged_at if first else None
        share_over = live.flagged_windows.get(s.rank, 0) / live.windows if live.windows else 0.0
        s.flagged = s.flagged or (first is not None and share_over >= 0.25)
    return {"threshold": threshold, "window": window, "steps": len(views), "alpha": ALPHA,
            "last_share_needed": last_share_needed(len(scores)) if scores else None,
            "ranks": [s.to_dict() for s in scores],
            "stragglers": [s.to_dict() for s in scores if s.flagged]}
