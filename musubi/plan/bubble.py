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


def warmup_forwards(schedule: str, pp: int, vpp: int, rank: int) -> int:
    """Forward passes (of one model chunk) pipeline rank `rank` runs before its first backward.

    Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py): 1F1B
    `pp - rank - 1`; interleaved `2 (pp - rank - 1) + (vpp - 1) pp` (the group of micro-batches
    per virtual stage is pp). ZB-H1 keeps 1F1B's warm-up (and memory).
    """
    if schedule == "interleaved":
        return 2 * (pp - rank - 1) + (vpp - 1) * pp
    if schedule in ("1f1b", "zb"):
        return pp - rank - 1
    raise ValueError(f"unknown schedule {schedule!r}")


def held_layer_microbatches(schedule: str, pp: int, vpp: int, micro_batches: int, rank: int,
                            chunk_layers: list[float]) -> float:
    """Peak activations rank `rank` keeps for backward, in layer x micro-batch units.

    Walks the rank's own order of work: warm-up forwards, then one forward and one backward in
    turn. Forward k runs model chunk (k // pp) mod vpp, backward k runs chunk vpp - 1 - (k // pp)
    mod vpp (Megatron's interleaved order; one chunk without interleaving). `chunk_layers[c]` is
    the layers of the rank's chunk c, so uneven chunks (a first stage that also holds the
    embedding) weigh what they hold. With even chunks the peak is Korthikanti 2022 sec. 4.2.3's
    closed form: L/p x p (1 + (p - 1)/(p v)) layers on the first stage.
    """
    if pp <= 1:
        return float(chunk_layers[0]) if chunk_layers else 0.0
    v = vpp if schedule == "interleaved" else 1
    if len(chunk_layers) != v:
        raise ValueError(f"{len(chunk_layers)} chunk sizes for {v} model chunks")
    total = micro_batches * v
    warm = min(warmup_forwards(schedule, pp, v, rank), total)
    if len(set(chunk_layers)) == 1:  # even chunks: the count of chunk-micro-batches alive peaks at warm-up + 1
        return min(warm + 1, total) * float(chunk_layers[0])
    held = [0] * v
    peak = 0.0
    done_f = done_b = 0

    def forward() -> None:
        nonlocal done_f, peak
        held[(done_f // pp) % v] += 1
        done_f += 1
        peak = max(peak, sum(n * layers for n, layers in zip(held, chunk_layers, strict=True)))

    def backward() -> None:
        nonlocal done_b
        held[v - 1 - (done_b // pp) % v] -= 1
        done_b += 1

    for _ in range(warm):
        forward()
    while done_f < total:  # steady state: one forward, one backward; the cool-down only frees memory
        forward()
        backward()
    return peak
