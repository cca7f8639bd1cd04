"""Pipeline bubbles and in-flight micro-batches of each schedule.

Fractions are idle time over useful time for p stages, m micro-batches per step and
v virtual stages per GPU, with forward F, input-backward B and weight-backward W of
equal cost (backward = 2 x forward):

- 1F1B (Narayanan et al. 2021): (p - 1) / m.
- interleaved 1F1B: (p - 1) / (v m); the first stage then holds 1 + (p - 1)/(p v) times
  the activations of plain 1F1B (Korthikanti et al. 2022, sec. 4.2.3).
- zero bubble ZB-H1 (Qi et al. 2023): B and W split, W fills the drain; bubble
  (p - 1)(F + B - 2W) / (m (F + B + W)) = (p - 1) / (3 m) with F = B = W, at 1F1B memory.
"""

from __future__ import annotations


def bubble_fraction(schedule: str, pp: int, micro_batches: int, vpp: int = 1) -> float:
    """Idle time of the pipeline as a fraction of its busy time (0 without pipelining)."""
    if pp <= 1:
        return 0.0
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    if schedule == "1f1b":
        return (pp - 1) / micro_batches
    if schedule == "interleaved":
        return (pp - 1) / (vpp * micro_batches)
    if schedule == "zb":
        return (pp - 1) / (3 * micro_batches)
    raise ValueError(f"unknown schedule {schedule!r}")


def in_flight_factor(schedule: str, pp: int, vpp: int = 1, micro_batches: int | None = None) -> float:
    """Activations the first stage holds, in units of "all layers for one micro-batch".

    1F1B keeps min(p, m) micro-batches of L/p layers alive on stage 0: L layers' worth when m >= p.
    """
    if pp <= 1:
        return 1.0
    warm = 1.0 if micro_batches is None else min(pp, micro_batches) / pp
    if schedule in ("1f1b", "zb"):
        return warm
    if schedule == "interleaved":
        return warm * (1.0 + (pp - 1) / (pp * vpp))
    raise ValueError(f"unknown schedule {schedule!r}")
