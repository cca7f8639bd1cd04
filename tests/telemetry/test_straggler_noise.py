"""The straggler judge against noise: synthetic span streams of many seeds (no training).

What the bar means (see musubi/telemetry/straggler.py): a rank is flagged when its median extra
pre-sync work over the other ranks reaches the bar (5 % of a step on GPUs) and the sign test says it is
clearly above the step-to-step noise, for PERSIST windows in a row and over the longer window too.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from musubi.telemetry.straggler import LONG, PERSIST, WARMUP, WINDOW, StragglerDetector, detect, score

BAR = 0.05
SEEDS = 25
FWD, BWD = 14.5, 18.0  # ms: a resnet50 bs128 step on an H200 (session 6), compute bound


def stream(seed: int, ranks: int = 2, steps: int = 120, cv: float = 0.02, slow: dict[int, float] | None = None,
           in_section: str | None = None, hiccup: tuple[int, float, float] | None = None,
           spikes: float = 0.0) -> Iterator[tuple[int, dict[int, dict]]]:
    """Aligned step records of a synchronous job.

    `cv`: per-rank, per-section Gaussian noise; `slow`: rank -> compute 1 + x slower (spread over forward
    and backward as a slower GPU is, or all in `in_section`, as the drills' injected work is); `hiccup`:
    (rank, probability, extra fraction of a step) - a rank that is slower in some steps only;
    `spikes`: probability per step and rank of a 1.5x step (a descheduled process).
    """
    rng = random.Random(seed)
    for k in range(1, steps + 1):
        drift = 1 + 0.03 * rng.gauss(0, 1)  # common to all ranks (clock, thermals): no one's lead
        work = {}
        for r in range(ranks):
            f = FWD * drift * max(0.5, 1 + cv * rng.gauss(0, 1))
            b = BWD * drift * max(0.5, 1 + cv * rng.gauss(0, 1))
            extra = (slow or {}).get(r, 0.0)
            if in_section:
                b += extra * (FWD + BWD)
            else:
                f, b = f * (1 + extra), b * (1 + extra)
            if hiccup and r == hiccup[0] and rng.random() < hiccup[1]:
                b += hiccup[2] * (FWD + BWD)
            if spikes and rng.random() < spikes:
                f *= 1.5
            work[r] = {"data": 0.01, "h2d": 0.0, "forward": f, "backward": b, "optimizer": 0.3}
        arrive = max(sum(w.values()) for w in work.values())
        recs = {}
        for r, w in work.items():
            secs = {**w, "grad_comm": arrive - sum(w.values()) + 0.7, "log": 0.2}
            recs[r] = {"kind": "step", "step": k, "rank": r, "wall_ms": sum(secs.values()), "host": secs}
        yield k, recs


def live_flags(steps: list[tuple[int, dict[int, dict]]], bar: float = BAR) -> list:
    d = StragglerDetector(bar)
    return [s for k, recs in steps for s in d.update(k, recs)]


NOISE = [
    pytest.param({"cv": 0.02}, id="gauss-2pct"),
    pytest.param({"cv": 0.06}, id="gauss-6pct"),
    pytest.param({"cv": 0.02, "spikes": 0.05}, id="spikes"),
    # Session 6's false alarm (healthy, 2x H200): rank 0 0.8 % slower over the run, yet over the 5 % bar
    # in a 20-step window for 9+ windows - a rank slower by about the bar in about half of its steps.
    pytest.param({"cv": 0.02, "hiccup": (0, 0.45, 0.06)}, id="hiccup-half-the-steps"),
    pytest.param({"cv": 0.02, "ranks": 4}, id="4-ranks"),
    pytest.param({"cv": 0.04, "ranks": 8, "spikes": 0.02}, id="8-ranks"),
]


@pytest.mark.parametrize("kw", NOISE)
def test_noise_only_streams_never_flag(kw: dict) -> None:
    for seed in range(SEEDS):
        steps = list(stream(seed, **kw))
        assert not live_flags(steps), (seed, kw)
        assert not detect(steps, BAR)["stragglers"], (seed, kw)


@pytest.mark.parametrize("kw", [
    pytest.param({"cv": 0.02}, id="slower-gpu"),
    pytest.param({"cv": 0.02, "in_section": "backward"}, id="injected-in-backward"),
    pytest.param({"cv": 0.02, "ranks": 4}, id="4-ranks"),
])
def test_a_rank_10_percent_slower_is_flagged_by_step_50(kw: dict) -> None:
    ranks = kw.get("ranks", 2)
    for seed in range(SEEDS):
        steps = list(stream(seed, slow={ranks - 1: 0.10}, **kw))
        flags = live_flags(steps)
        assert [f.rank for f in flags] == [ranks - 1], (seed, flags)
        assert flags[0].flagged_at <= 50, (seed, flags[0])
        # Where the extra time goes: the injected section, or forward/backward for a slower GPU.
        assert flags[0].section in ((kw["in_section"],) if "in_section" in kw else ("forward", "backward"))
        assert [s["rank"] for s in detect(steps, BAR)["stragglers"]] == [ranks - 1]


def test_a_rank_10_percent_slower_under_heavy_noise_is_flagged_by_step_50_in_9_of_10() -> None:
    """Per-section noise of 4 % and a 1.5x forward on 5 % of each rank's steps: issue 21's 9/10 bar."""
    at = []
    for seed in range(30):
        flags = live_flags(list(stream(seed, slow={1: 0.10}, cv=0.04, spikes=0.05)))
        assert [f.rank for f in flags] == [1], seed
        at.append(flags[0].flagged_at)
    assert sum(a <= 50 for a in at) >= 27 and max(at) <= 80, at


def test_bar_semantics() -> None:
    """Flagged at 2x the bar from the earliest step; at the bar's edge only with consistent evidence."""
    first = WARMUP + WINDOW + PERSIST - 1
    for seed in range(20):
        clear = live_flags(list(stream(seed, slow={1: 2 * BAR})))
        assert clear and clear[0].flagged_at == first, seed  # ~9.5 % of a step: no noise can hide it
        assert not live_flags(list(stream(seed, slow={1: 0.5 * BAR}))), seed  # half the bar: never
        # Slower by 1.5x the bar in only 45 % of the steps: its median excess is under the bar.
        assert not live_flags(list(stream(seed, hiccup=(1, 0.45, 1.5 * BAR)))), seed
    # A rank slower by the bar itself, with the median right at it: the sign test wants more than half
    # the steps over the bar, so it is not flagged reliably - a 5 % bar catches 10 %, not 5 %.
    at_bar = sum(bool(live_flags(list(stream(seed, slow={1: BAR * (FWD + BWD + 1.2) / (FWD + BWD)})))) for seed in range(20))
    assert at_bar < 10


def test_a_slowdown_that_starts_mid_run_is_flagged_and_cleared() -> None:
    steps = list(stream(3, steps=200))
    slow = dict(stream(3, steps=200, slow={1: 0.2}))
    mixed = [(k, slow[k] if 80 < k <= 140 else recs) for k, recs in steps]
    d = StragglerDetector(BAR)
    flagged, cleared = [], []
    for k, recs in mixed:
        flagged += [(k, s.rank) for s in d.update(k, recs)]
        cleared += [(k, r) for r in d.cleared_now]
    # The long window must hold a clear majority of slow steps first (26 of 40): within LONG steps.
    assert len(flagged) == 1 and flagged[0][1] == 1 and 80 + PERSIST <= flagged[0][0] <= 80 + LONG
    assert len(cleared) == 1 and 140 < cleared[0][0] <= 140 + WINDOW + PERSIST


class _EagerLongWindow(StragglerDetector):
    """The detector as it was before 2026-11-27: the longer window scored at every step, flag or not."""

    def _longer_window(self, held: list, scores: list) -> dict | None:
        return {s.rank: s for s in score(held, self.threshold)} if len(held) > self.window else None


@pytest.mark.parametrize("kw", [*NOISE, pytest.param({"slow": {1: 0.10}}, id="slow-10pct"),
                                pytest.param({"cv": 0.02, "hiccup": (1, 0.6, 0.09)}, id="hiccup-burst")])
def test_scoring_the_long_window_only_on_a_short_flag_changes_no_flag(kw: dict) -> None:
    """The longer window confirms a flag of the 20-step one and decides nothing else, so the live detector
    scores it only then (the watch's work on rank 0 halved): flags, their steps and every rank's latest scores
    are those of scoring it at every step."""
    for seed in range(8):
        steps = list(stream(seed, steps=150, **kw))
        lazy, eager = StragglerDetector(BAR), _EagerLongWindow(BAR)
        a = [(s.rank, s.flagged_at) for k, recs in steps for s in lazy.update(k, recs)]
        b = [(s.rank, s.flagged_at) for k, recs in steps for s in eager.update(k, recs)]
        assert a == b
        assert {r: s.to_dict() for r, s in lazy.latest.items()} == {r: s.to_dict() for r, s in eager.latest.items()}
        assert lazy.active == eager.active and lazy.streak == eager.streak
        assert lazy.flagged_windows == eager.flagged_windows
