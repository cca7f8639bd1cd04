"""`train.log_every` left unset: the log interval follows the run's length (musubi/worker/reporting.py)."""

from __future__ import annotations

from musubi.worker.reporting import log_interval


def test_log_interval_gives_a_short_run_a_curve() -> None:
    # 16 steps: every step (the old fixed 10 logged one point); 100: every 5 (20 points); long runs: every 10
    assert [log_interval(n) for n in (1, 16, 40, 100, 200, 10_000)] == [1, 1, 2, 5, 10, 10]
    assert all(n // log_interval(n) >= min(n, 20) for n in range(1, 400))


def test_a_pipe_gets_a_few_console_lines_of_a_short_run_and_every_tenth_step_of_a_long_one() -> None:
    """In a pipe (CI, the quickstart's log) a 12-step run prints 4 step lines, not 12, a 192-step one 5; metrics.jsonl
    keeps its curve. A console line is always a logged record, and a long run has one each 50 steps."""
    from musubi.worker.reporting import console_interval

    assert [console_interval(n, log_interval(n)) for n in (3, 12, 40, 192, 1000, 10**5)] == [1, 3, 8, 36, 50, 50]
    for n in range(1, 2000):
        every, k = log_interval(n), console_interval(n, log_interval(n))
        assert k % every == 0 and k <= 50 and n // k <= max(6, n // 50), n
