"""`train.log_every` left unset: the log interval follows the run's length (musubi/worker/reporting.py)."""

from __future__ import annotations

from musubi.worker.reporting import log_interval


def test_log_interval_gives_a_short_run_a_curve() -> None:
    # 16 steps: every step (the old fixed 10 logged one point); 100: every 5 (20 points); long runs: every 10
    assert [log_interval(n) for n in (1, 16, 40, 100, 200, 10_000)] == [1, 1, 2, 5, 10, 10]
    assert all(n // log_interval(n) >= min(n, 20) for n in range(1, 400))
