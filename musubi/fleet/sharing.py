"""Two small jobs on one GPU: when the packer may put a second job on a GPU a job already holds, and how much
slower both then run.

A GPU is shared only between two single-GPU jobs whose measurements say it is safe (machine.share_gpus:
auto, opt-in until a GPU run measures its gain; the default `off` never shares):

- both have a recorded GPU utilisation u (NVML's "utilisation": the fraction of time a kernel of the job
  ran, the mean over its training after the first tenth of the samples) and a recorded peak GPU memory
  (NVML's memory used on its GPU, CUDA context and allocator cache included), from an earlier run of the
  same job on this machine that held its GPU alone (fleet/durations.py); a job without them never shares;
- each utilisation is at most SMALL_UTIL and u1 + u2 <= UTIL_LIMIT, and peak1 + peak2 + headroom <= the GPU's
  memory (headroom: the larger of HEADROOM_GIB and HEADROOM_FRACTION of the GPU), so neither can run the other
  out of memory;
- the second job takes the slot only when no GPU is free and no job before it in the queue waits for
  whole GPUs (a guest never delays a wider or earlier job: no starvation);
- the fleet's plan (fleet/moldable.py) is simulated with and without sharing and sharing is kept only
  when it predicts a makespan shorter by SHARE_MARGIN (10 %) or more.

The slowdown model. Without MPS, kernels of two processes do not run at once: the GPU time-slices between
their contexts, and a job whose kernel is ready while the other context holds the GPU waits. A job beside
others at utilisations u_j runs 1 + sum(u_j) times slower than alone: it loses the other's busy time,
whatever its own utilisation. Measured with bench/fleet.py (BENCHMARKS.md, fleet), a small job beside a busy
one slowed by more than this model says, and far more than the first model, max(1, u1 + u2), which predicted no
slowdown; the busy one slowed by about what it says. A latency-bound job (many short kernels, low
utilisation) waits for a whole time slice each time, so beside a busy job it loses more than the model says:
hence SMALL_UTIL, which keeps sharing to jobs that both leave the GPU mostly idle. The model still ignores
the host cores the two jobs share (their loaders, the GPU's cores when pinned): bench/fleet.py
`--modes fleet-unshared` measures the same fleet without sharing, and that figure says whether sharing paid.

Measured beats modelled. Two small external detectors, each keeping several of its GPU's pinned cores busy,
shared GPUs pairwise in a fleet and ran about 3x slower while shared where this model said 1.2x, while other
GPUs idled: the fleet ended later than its unshared plan (BENCHMARKS.md, fleet). The cause was not traced. The leading suspect is the host cores: a job that
joins a GPU gets that GPU's cores and thread count (fleet/local.py), so each pair ran 2 x 16 intra-op threads on
the same 16 pinned cores (their CPU use alone was not kept); time slices of two launch-bound processes are the
other candidate. So a job that ran shared keeps what it measured: the fleet records its slowdown while shared
(durations.record_shared_run), the plan simulates it with the larger of the model and that figure, and a job
measured at MAX_SHARED_SLOWDOWN or more never shares again (two jobs each that much slower finish no sooner than
one after the other on the same GPU).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Most summed utilisation two jobs may have to share a GPU (below 1: some slack for the context switches).
UTIL_LIMIT = 0.9
#: Most utilisation either job may have: sharing is for small jobs. A small job beside a busy one ran 2x slower
#: or more (BENCHMARKS.md, fleet): time slices of a busy neighbour stall a latency-bound job's short kernels.
SMALL_UTIL = 0.5
#: Memory kept free on a shared GPU beyond both jobs' recorded peaks (GiB), or this fraction of the GPU.
HEADROOM_GIB = 2.0
HEADROOM_FRACTION = 0.1
#: Sharing must predict a fleet (the rest of it, when re-planning) this much shorter than not sharing. The
#: model's slowdowns fell short of the measured ones by a few % for a busy job and by half or more for small
#: jobs beside others, and a re-plan that shared for a predicted gain of about a second ended the fleet's jobs
#: later than its unshared plan (BENCHMARKS.md, fleet).
SHARE_MARGIN = 0.1
#: A job measured this many times slower while sharing (or more) never shares again: two such jobs on one GPU
#: end no earlier than one after the other.
MAX_SHARED_SLOWDOWN = 2.0


@dataclass(frozen=True)
class SharePolicy:
    """What one GPU of this machine offers two jobs that share it."""

    memory_gib: float  # one GPU's memory
    util_limit: float = UTIL_LIMIT
    small_util: float = SMALL_UTIL

    @property
    def headroom_gib(self) -> float:
        """Memory left free on a shared GPU (GiB)."""
        return max(HEADROOM_GIB, HEADROOM_FRACTION * self.memory_gib)

    def fits(self, a_util: float | None, a_peak: float | None, b_util: float | None, b_peak: float | None,
             measured: Iterable[float | None] = ()) -> bool:
        """Whether two measured jobs may share one GPU (an unmeasured one never may; nor one whose slowdown while
        sharing was `measured` at MAX_SHARED_SLOWDOWN or more)."""
        if None in (a_util, a_peak, b_util, b_peak):
            return False
        if any(m is not None and m >= MAX_SHARED_SLOWDOWN for m in measured):
            return False
        return (max(a_util, b_util) <= self.small_util + 1e-9  # type: ignore[type-var]
                and a_util + b_util <= self.util_limit + 1e-9  # type: ignore[operator]
                and a_peak + b_peak + self.headroom_gib <= self.memory_gib + 1e-9)  # type: ignore[operator]

    def why(self, a_util: float, a_peak: float, b_util: float, b_peak: float) -> str:
        """The figures that allowed sharing, for the placement reason."""
        return (f"utilisation {a_util:.2f}+{b_util:.2f} <= {self.util_limit:.2f} (each <= {self.small_util:.2f}), "
                f"memory {a_peak:.1f}+{b_peak:.1f}"
                f"+{self.headroom_gib:.1f} <= {self.memory_gib:.1f} GiB")


def slowdown(others: Iterable[float], measured: float | None = None) -> float:
    """How many times slower a job runs on a time-sliced GPU than alone, beside jobs at utilisations `others`:
    1 + their sum (see the model above), or what it measured while shared when that is more."""
    others = list(others)
    model = 1.0 + sum(others)
    return max(model, measured) if others and measured is not None else model


def overlap_s(start: float, end: float, others: Iterable[tuple[float, float]]) -> float:
    """Seconds of [start, end] that the intervals `others` (each partner's time on the GPU) cover, summed."""
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in others)


def measured_slowdown(seconds: float, alone_s: float, shared_s: float) -> float | None:
    """How many times slower a job ran during the `shared_s` seconds it shared its GPU, from its run of `seconds`
    against `alone_s` predicted alone: it lost (seconds - alone_s) while shared, so it progressed at
    1 - lost/shared_s of its speed there. None: too little sharing to tell; capped at 10 (it barely progressed)."""
    if shared_s < 1.0 or alone_s <= 0:
        return None
    lost = max(0.0, seconds - alone_s)
    rate = 1.0 - lost / shared_s
    return round(1.0 / rate, 3) if rate > 0.1 else 10.0


def share_policy(mode: str, kind: str, gpu_memory_gib: float | None) -> SharePolicy | None:
    """The fleet's policy: machine.share_gpus `auto` on GPUs whose memory is known; None (never share) else."""
    if mode != "auto" or kind != "cuda" or not gpu_memory_gib:
        return None
    return SharePolicy(gpu_memory_gib)


def share_note(queue: Iterable, policy: SharePolicy) -> str:
    """Why no GPU is shared in a plan (for `--dry-run`): which jobs lack measurements, or that none pays."""
    single = [d for d in queue if 1 in d.allowed()]
    unmeasured = [d.name for d in single if d.util is None or d.peak_gib is None]
    if len(single) < 2:
        return "GPU sharing: fewer than two single-GPU jobs, nothing to share"
    if len(unmeasured) == len(single):
        return ("GPU sharing: no job has a measured utilisation and peak memory yet (an earlier run of it alone "
                "on one GPU records them)")
    return (f"GPU sharing: no pair of measured jobs fits (each <= {policy.small_util:.2f} utilisation, "
            f"both <= {policy.util_limit:.2f}, "
            f"{policy.memory_gib:.0f} GiB less {policy.headroom_gib:.1f} GiB headroom) or sharing did not shorten "
            f"the predicted makespan" + (f"; unmeasured: {', '.join(unmeasured)}" if unmeasured else ""))
