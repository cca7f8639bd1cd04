"""Straggler detection from per-rank step records: who is slow, in which section, and who arrives last.

Synchronous training makes every rank's step as long as the slowest one's, so
step times alone name no one. Two measurements do:

- *Local work before the sync* (data, h2d, forward, pre-sync backward,
  optimizer): a rank's own time in each section, compared per step with the
  fastest rank's in that section, as a fraction of the step; the section where
  the median of that difference is largest is the rank's *excess* (per section:
  a neighbour's noise spread over other sections does not hide a lead in one).
  Also compared with the rank's own earlier history.
- *Last arrival* at the gradient all-reduce: the rank whose exposed
  `grad_comm` wait is shortest arrived last; the others' collectives look long
  because they wait for it.

A rank is flagged when its median excess over a window of steps reaches the
threshold and it arrived last in a clear majority of those steps (live: for
PERSIST windows in a row, so a burst of noise from a neighbour is not a flag).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from musubi.telemetry.step_record import LOCAL_WORK, local_work_ms, sections_ms, wall_ms

WINDOW = 20  # steps in the sliding window of the live watch; fewer steady steps are not judged
WARMUP = 5  # first steps skipped (allocator, autotuning, bucket rebuild)
PERSIST = 5  # consecutive windows a rank must stay over the bar before the live watch flags it
#: Default bars (fraction of a step) when `telemetry.straggler_threshold` is not set. CPU ranks share
#: the host's cores and its scheduler: a healthy 2-rank resnet18 on 2 cores measured 5.0 % of excess
#: over 11 steps and 2.2 % over 59 (2026-11-27), and the drill suite's sleep jitter reaches a few ms of
#: a 33 ms step; 7 % (the drills' calibrated bar) stays above that and still names a rank 10 % slower.
GPU_THRESHOLD = 0.05
CPU_THRESHOLD = 0.07


def default_threshold(configured: float | None, on_gpu: bool) -> float:
    """The straggler bar in force: the job's `telemetry.straggler_threshold`, else the device's default."""
    if configured is not None:
        return float(configured)
    return GPU_THRESHOLD if on_gpu else CPU_THRESHOLD


@dataclass
class StepView:
    """What the detector keeps of one step: per-rank work, sections, wall, last arriver."""

    step: int
    wall: float
    work: dict[int, float]
    sections: dict[int, dict[str, float]]
    last: int | None
    walls: dict[int, float] | None = None  # each rank's own step wall time


def view(step: int, recs: dict[int, dict[str, Any]]) -> StepView:
    """Reduce one aligned step (all ranks' records) to what the scores need."""
    comm = {r: sections_ms(x).get("grad_comm") for r, x in recs.items()}
    last = min(comm, key=lambda r: comm[r]) if len(recs) > 1 and all(v is not None for v in comm.values()) else None
    return StepView(step=step, wall=max(wall_ms(x) for x in recs.values()) or 1e-9,
                    work={r: local_work_ms(x) for r, x in recs.items()},
                    sections={r: sections_ms(x) for r, x in recs.items()}, last=last,
                    walls={r: wall_ms(x) for r, x in recs.items()})


@dataclass
class RankScore:
    """One rank's straggler figures over a span of steps."""

    rank: int
    excess: float  # in `section`: median (time - fastest rank's time) / step wall
    section: str  # the local section with the largest median excess
    work_excess: float  # the same over all local work together
    last_share: float | None  # fraction of steps where this rank arrived last at the gradient all-reduce
    history: float | None  # median work now / median work in the first window (1.0 = unchanged)
    flagged: bool
    flagged_at: int | None = None
    cv: float | None = None  # this rank's step-time coefficient of variation (after warm-up)
    p99_p50: float | None = None  # its p99 / median step time (the right tail pinning aims to narrow)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


def last_share_needed(world: int) -> float:
    """Share of last arrivals that singles a rank out (well above the 1/world of chance)."""
    return min(0.6, 1.2 / max(world, 1))


def tail(walls: list[float]) -> tuple[float | None, float | None]:
    """(coefficient of variation, p99/p50) of step times; None where there are too few (or zero) times."""
    walls = [w for w in walls if w > 0]
    if len(walls) < 2:
        return None, None
    mean, med = statistics.fmean(walls), statistics.median(walls)
    p99 = statistics.quantiles(walls, n=100, method="inclusive")[98]
    return round(statistics.pstdev(walls) / mean, 4), round(p99 / med, 4) if med else None


def score(views: list[StepView], threshold: float, baseline: dict[int, float] | None = None) -> list[RankScore]:
    """Scores of every rank over `views` (aligned steps, warm-up already dropped)."""
    if not views:
        return []
    ranks = sorted(views[0].work)
    need = last_share_needed(len(ranks))
    out = []
    with_last = [v for v in views if v.last is not None]
    for r in ranks:
        work_excess = statistics.median((v.work[r] - min(v.work.values())) / v.wall for v in views)
        per_section = {
            s: statistics.median((v.sections[r].get(s, 0.0) - min(x.get(s, 0.0) for x in v.sections.values()))
                                 / v.wall for v in views)
            for s in LOCAL_WORK
        }
        section = max(per_section, key=lambda s: per_section[s])
        share = (sum(1 for v in with_last if v.last == r) / len(with_last)) if with_last else None
        work_now = statistics.median(v.work[r] for v in views)
        hist = work_now / baseline[r] if baseline and baseline.get(r) else None
        excess = per_section[section]
        cv, p99_p50 = tail([v.walls[r] for v in views if v.walls and r in v.walls])
        flagged = len(ranks) > 1 and excess >= threshold and (share is None or share >= need)
        out.append(RankScore(rank=r, excess=round(excess, 4), section=section, work_excess=round(work_excess, 4),
                             last_share=None if share is None else round(share, 3),
                             history=None if hist is None else round(hist, 3), flagged=flagged,
                             cv=cv, p99_p50=p99_p50))
    return out


class StragglerDetector:
    """Streaming detection over a sliding window; `update` returns the ranks newly flagged."""

    def __init__(self, threshold: float = 0.05, window: int = WINDOW, warmup: int = WARMUP) -> None:
        self.threshold, self.window, self.warmup = threshold, window, warmup
        self.views: deque[StepView] = deque(maxlen=window)
        self.baseline: dict[int, float] | None = None
        self.active: set[int] = set()
        self.first_flag: dict[int, RankScore] = {}
        self.streak: dict[int, int] = {}
        self.windows = 0  # windows scored so far
        self.flagged_windows: dict[int, int] = {}  # per rank: windows in which it was over the bar
        self.clean: dict[int, int] = {}  # per rank: windows in a row under the bar
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
        views = list(self.views)
        if self.baseline is None:
            self.baseline = {r: statistics.median(v.work[r] for v in views) for r in views[0].work}
        new = []
        self.cleared_now = []
        self.windows += 1
        self.scored_at = step
        for s in score(views, self.threshold, self.baseline):
            self.latest[s.rank] = s
            self.streak[s.rank] = self.streak.get(s.rank, 0) + 1 if s.flagged else 0
            self.clean[s.rank] = 0 if s.flagged else self.clean.get(s.rank, 0) + 1
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


def detect(aligned: list[tuple[int, dict[int, dict]]], threshold: float, window: int = WINDOW,
           warmup: int = WARMUP) -> dict[str, Any]:
    """Offline: scores over all steps, and the streaming detector's view of the same steps.

    A rank is a straggler when its whole-span scores say so, or when the streaming
    detector flagged it and kept it over the bar for at least a quarter of the
    windows (a rank slow for part of the run, or one whose lead a noisy neighbour
    sometimes hides, is still named).
    """
    live = StragglerDetector(threshold, window, warmup)
    for step, recs in aligned:
        live.update(step, recs)
    views = [view(k, recs) for k, recs in aligned if k > warmup and len(recs) > 1]
    base = None
    if len(views) >= window:
        base = {r: statistics.median(v.work[r] for v in views[:window]) for r in views[0].work}
    scores = score(views, threshold, base)
    for s in scores:
        first = live.first_flag.get(s.rank)
        s.flagged_at = first.flagged_at if first else None
        share_over = live.flagged_windows.get(s.rank, 0) / live.windows if live.windows else 0.0
        s.flagged = s.flagged or (first is not None and share_over >= 0.25)
    return {"threshold": threshold, "window": window, "steps": len(views),
            "last_share_needed": last_share_needed(len(scores)) if scores else None,
            "ranks": [s.to_dict() for s in scores],
            "stragglers": [s.to_dict() for s in scores if s.flagged]}
