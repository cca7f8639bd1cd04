"""The one global set of achieved-efficiency constants the time model uses.

Each constant is a fraction of a catalog peak (FLOP/s or GB/s), so one set serves every
GPU (a catalog entry's `achieved` figures override matmul/flash for that GPU). `matmul` and
`hbm` are the fit of musubi/plan/fit.py on the fit set (shared/validation/published_runs.csv,
copied to data/validation/fit_runs.csv) and nothing else; the rest are physical priors. They
are never fitted per row or per model, and never on the held-out runs
(data/validation/heldout_runs.csv). `musubi plan --calibrate FILE` replaces them with what one
machine measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak, latencies and noise used by the step-time model."""

    #: Large bf16 GEMMs sustain this fraction of dense peak (cuBLAS on A100: 0.75-0.8); fitted (fit.py).
    matmul: float = 0.775
    #: Additive roofline: a GEMM also pays this share of its operand traffic (M K + K N + M N
    #: elements) at HBM speed; it is what makes thin GEMMs (small hidden / TP) slower.
    gemm_memory: float = 0.5
    #: Memory-bound kernels (norms, residual adds, softmax, dropout) reach this fraction of HBM
    #: bandwidth; it also absorbs traffic the byte counts leave out (casts, layout copies); fitted (fit.py).
    hbm: float = 0.65
    #: Fused (flash) attention, FlashAttention-2: fraction of dense peak on the FLOPs it executes (causal
    #: half square) once the sequence is long enough to fill the GPU (the plateau of the kernel's curve:
    #: attention.py). FA2 paper (Dao 2023, arXiv:2307.08691, abstract): 50-73 % of A100 peak.
    flash: float = 0.5
    #: The first generation of fused kernels (FlashAttention-1 and its Triton port, 2022 to mid-2023):
    #: 25-40 % of A100 peak (the same abstract); the midpoint.
    flash1: float = 0.325
    #: The Hopper generation (FlashAttention-3, cuDNN's fused attention that Transformer Engine and SDPA's
    #: cuDNN backend run): wgmma/TMA kernels that exist only on Hopper and later, so elsewhere it runs what
    #: FA2 runs and gets FA2's share; Hopper GPUs carry their measured share in the catalog (`achieved`).
    flash3: float = 0.5
    #: Bus bandwidth NCCL ring/tree collectives reach, as a fraction of the link's per-direction rate.
    nvlink: float = 0.8
    pcie: float = 0.7
    network: float = 0.8
    #: Fixed cost of one send, all-to-all or context-parallel ring step (launch + synchronisation), seconds.
    latency_s: dict[str, float] = field(default_factory=lambda: {"nvlink": 10e-6, "pcie": 15e-6,
                                                                  "network": 20e-6})
    #: The least one collective call costs through torch.distributed (NCCL launch, c10d's work and stream
    #: bookkeeping), back to back, seconds: the median of the calls of 64 KiB-1 MiB on 2 H200 (torch 2.11,
    #: NCCL 2.28; bench/nccl_sweep.py, BENCHMARKS.md planner). all_gather serves reduce-scatter too.
    call_s: dict[str, float] = field(default_factory=lambda: {"all_reduce": 27.5e-6, "all_gather": 44e-6})
    #: All-gather / reduce-scatter bus bandwidth against all-reduce's inside a node: 267 / 331.5 GB/s at 1 GiB
    #: on 2 H200 (the same sweep: all-gather 268.1, reduce-scatter 266.4, all-reduce 331.5).
    gather_share: float = 0.8
    #: Compute slows by this fraction while a collective runs beside it: NCCL's kernels hold SMs (an all-gather's
    #: 24 CTAs of an H100's 132) and HBM bandwidth the GEMMs would use. "Characterizing Compute-Communication
    #: Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv:2507.03114, abstract: GPT/LLaMA layers with
    #: overlapped collectives on 4x A100, H100, MI250, MI210) measures 18.9 % average computational slowdown,
    #: 40 % at most. A prior from that paper, not fitted.
    contention: float = 0.189
    #: Per-rank step-time coefficient of variation behind the straggler tax (1 %: a healthy cluster).
    straggler_cv: float = 0.01
    #: Multiplies the predicted step time; 1 unless a calibration measured a whole step.
    step_scale: float = 1.0
    #: The same for weight-sharded layouts (ZeRO-3 / FSDP), when a sharded run was measured: their
    #: per-unit gathers, hooks and launches cost what a replicated run's step does not show
    #: (an FSDP step measured longer than DDP's for the same GPT: BENCHMARKS.md, planner). None: use step_scale.
    step_scale_sharded: float | None = None
    #: Whether step_scale came from a measured step (set by calibration, not by hand).
    step_fitted: bool = False
    #: Constants a calibration measured on the machine; they win over the catalog's per-GPU `achieved`.
    measured: frozenset[str] = frozenset()

    def fraction(self, name: str, achieved: dict[str, float]) -> float:
        """`matmul`, `flash`, `flash1` or `flash3` for one GPU: measured here, else the catalog's figure, else the global default."""
        if name in self.measured or name not in achieved:
            return float(getattr(self, name))
        return achieved[name]

    def scale_for(self, zero: int) -> float:
        """The step-time multiplier of a layout with this ZeRO stage."""
        if zero >= 3 and self.step_scale_sharded is not None:
            return self.step_scale_sharded
        return self.step_scale

    def link(self, tier: str) -> float:
        """Bus-bandwidth fraction of a tier."""
        return {"nvlink": self.nvlink, "pcie": self.pcie, "network": self.network}[tier]


DEFAULT_EFFICIENCY = Efficiency()
