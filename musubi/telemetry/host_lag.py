"""Is a slow rank's own GPU slow, or its host? The test the live watch and the diagnosis share.

A rank can fall behind its peers for two reasons that look alike in step times:

- its GPU is slower (another process on it, clocks, a weaker card): its GPU stays busy all the time,
  and so do the others' (NCCL's kernel spins while they wait for it);
- its host is slower at issuing work (a CPU-bound loop, contention on its cores, interpreter jitter):
  its GPU idles between kernels, NVML utilisation drops below its peers'.

The second has two causes with opposite verdicts. Other processes on the rank's cores are a real,
persistent fault (the CPU-hog scenario: cores 100 % busy, most of it not the rank's): it is an alarm.
A rank whose cores are quiet and whose GPU still waits is a launch-bound job's host jitter, which
moves from rank to rank: in a healthy launch-bound run, a rank flagged behind had its GPU less busy
than its peer's and its cores quiet (BENCHMARKS.md, telemetry). That is `host_lag`: evidence, not an
alarm. A GPU hog (another process on the rank's GPU) keeps that GPU as busy as its peer's, and a CPU
hog shows the rank's cores busy with others' work: both are told apart from it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

#: A rank whose GPU is busy (NVML utilisation) this many points less than the other ranks' median
#: waits for its own host to launch kernels (the healthy false alarms above: 11-19 points; the GPU hog: 0).
HOST_LAG_UTIL = 5.0
#: A rank's own cores are CPU-contended when they are this busy (% of each, mean) ...
CONTENDED_BUSY = 90.0
#: ... and at least this share of that busy time is not the rank's (its process and its loader workers).
CONTENDED_FOREIGN = 0.25
#: Sampler figures averaged for these tests.
KEYS = ("util", "sm_active", "proc_cpu", "workers_cpu", "host_cpu", "cores_cpu", "cores")


def mean_figures(samples: Iterable[dict[str, Any]], keys: Iterable[str] = KEYS) -> dict[str, Any]:
    """Means of the numeric sampler figures `keys` over `samples` ({'samples': n} plus each key seen)."""
    xs = list(samples)
    out: dict[str, Any] = {"samples": len(xs)}
    for key in keys:
        vals = [float(s[key]) for s in xs if isinstance(s.get(key), (int, float)) and not isinstance(s.get(key), bool)]
        if vals:
            out[key] = round(sum(vals) / len(vals), 1)
    return out


def foreign_share(fig: dict[str, Any]) -> float | None:
    """Share of the rank's busy cores taken by other processes when they are contended (busy at least
    CONTENDED_BUSY and CONTENDED_FOREIGN of it not the rank's own); 0.0 when not contended; None when
    the rank is not pinned (its cores are not sampled: contention cannot be told)."""
    cores, busy = fig.get("cores"), fig.get("cores_cpu")
    if not cores or busy is None:
        return None
    own = fig.get("proc_cpu", 0.0) + fig.get("workers_cpu", 0.0)
    used = busy * cores  # % of one core
    foreign = max(0.0, 1.0 - own / used) if used else 0.0
    return foreign if busy >= CONTENDED_BUSY and foreign >= CONTENDED_FOREIGN else 0.0


def host_lag(rank: int, figs: dict[int, dict[str, Any]]) -> str | None:
    """Evidence that `rank`'s GPU idles waiting for its own host while its cores are quiet, or None.

    Both must be measured: its utilisation HOST_LAG_UTIL points under the other ranks' median, and its
    (pinned) cores not contended. An unpinned rank, or one with no GPU figures, is never excused.
    """
    g = figs.get(rank) or {}
    mine = g.get("util")
    others = [f["util"] for r, f in figs.items() if r != rank and f.get("util") is not None]
    if mine is None or not others or statistics.median(others) - mine < HOST_LAG_UTIL:
        return None
    if foreign_share(g) != 0.0:  # contended (a real fault), or not pinned (cannot tell)
        return None
    return (f"its GPU was busy {mine:.0f} % of the time against {statistics.median(others):.0f} % on the other "
            f"ranks and its {g['cores']:g} core(s) only {g['cores_cpu']:.0f} % busy: it waits for this rank's host "
            "to launch its kernels (a slow GPU stays busy), with no other process on its cores; remedies are on "
            "the host: its CPU, or fewer launches a step (a larger batch, CUDA graphs)")
