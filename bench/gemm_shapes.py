"""Measure the planner's compute terms on one GPU: transformer GEMMs by shape, a sustained GEMM, fused attention.

    python bench/gemm_shapes.py [--gpu H200] [--out FILE.json] [--sustain-s 60] [--device cuda|cpu] [--quick]

What it settles (issue 48; docs/guides/planner-published-runs.md, "Still wrong"): the planner prices a
GEMM as 2MKN / (peak x matmul) plus an operand-traffic roofline (musubi/plan/compute.py `gemm_s`) and a
fused attention kernel at plateau x s / (s + 230) of peak (musubi/plan/attention.py). Both were checked
only against published tables (XLA's sm_90 cost table, a pytorch/benchmark sweep). This script times
the same shapes on the lent GPU and prints, per shape, measured TFLOP/s next to the planner's:

1. `gemms`: the forward GEMMs of one layer (QKV, projection, MLP up, MLP down) of GPT-3 175B (TP 8),
   Llama 3 70B (TP 4 and 8), Llama 3 8B (TP 1) and Nemotron-4 15B (TP 4) at 2k-16k tokens per micro-batch
   (a fixed global batch over more GPUs shrinks the micro-batch, so its GEMMs), plus square shapes;
2. `sustained`: one large GEMM run back to back for --sustain-s seconds, TFLOP/s per 2-s window with the
   SM clock and power nvidia-smi reports: whether the rate of a short benchmark holds under a training
   run's sustained power (the H100 rows the planner over-predicts);
3. `attention`: causal scaled-dot-product attention, bf16, head dim 128 and 64, batch x seq = 16k tokens,
   for each fused backend torch offers (flash, cudnn), forward and forward + backward.

Nothing here trains or downloads anything. `--device cpu --quick` runs tiny shapes to check the script.
The result file goes to --out, else $OUT/gemm_shapes.json where $OUT is set, else
bench/results/gemm-shapes-DATE-CARD.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import result_path, write_result  # noqa: E402
from musubi.plan.attention import flash_rate_fraction  # noqa: E402
from musubi.plan.catalog import get_gpu  # noqa: E402
from musubi.plan.cluster import make_cluster  # noqa: E402
from musubi.plan.compute import device as plan_device  # noqa: E402
from musubi.plan.compute import gemm_s  # noqa: E402
from musubi.plan.efficiency import DEFAULT_EFFICIENCY  # noqa: E402

#: (name, hidden, heads, kv_heads, ffn, mlp matrices, tp): the layers whose GEMMs are timed.
MODELS = [
    ("gpt3-175b", 12288, 96, 96, 49152, 2, 8),
    ("llama3-70b", 8192, 64, 8, 28672, 3, 4),
    ("llama3-70b", 8192, 64, 8, 28672, 3, 8),
    ("llama3-8b", 4096, 32, 8, 14336, 3, 1),
    ("nemotron4-15b", 6144, 48, 8, 24576, 2, 4),
]
TOKENS = (2048, 4096, 8192, 16384)
SQUARES = (2048, 4096, 8192)
ATTN_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
ATTN_TOKENS = 16384


def layer_gemms(hidden: int, heads: int, kv: int, ffn: int, matrices: int, tp: int,
                tokens: int) -> list[tuple[str, int, int, int]]:
    """(op, M, K, N) of one layer's forward GEMMs on one GPU, as compute.layer_times prices them."""
    head_dim = hidden // heads
    kv_cols = 2 * kv * head_dim * max(1, tp // kv) // tp
    return [("qkv", tokens, hidden, hidden // tp + kv_cols), ("proj", tokens, hidden // tp, hidden),
            ("mlp_up", tokens, hidden, (matrices - 1) * ffn // tp), ("mlp_down", tokens, ffn // tp, hidden)]


def planner_gemm_tflops(gpu: str, m: int, k: int, n: int) -> float:
    """The planner's rate for one [m x k] @ [k x n] bf16 GEMM on `gpu`, TFLOP/s."""
    dev = plan_device(make_cluster(get_gpu(gpu), 1), DEFAULT_EFFICIENCY, "bf16")
    return 2 * m * k * n / gemm_s(dev, m, k, n) / 1e12


def _sync(torch: Any, dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def time_op(torch: Any, dev: str, fn: Any, min_s: float) -> float:
    """Median seconds of `fn()` over repeated batches lasting at least `min_s` each (after a warm-up)."""
    for _ in range(3):
        fn()
    _sync(torch, dev)
    reps, samples = 1, []
    while True:  # grow the batch until one batch lasts min_s
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(torch, dev)
        elapsed = time.perf_counter() - start
        if elapsed >= min_s or reps >= 4096:
            break
        reps *= 2
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(torch, dev)
        samples.append((time.perf_counter() - start) / reps)
    return sorted(samples)[1]


def gpu_reading() -> dict[str, float]:
    """SM clock (MHz) and power (W) of GPU 0 from nvidia-smi, or {} where it is absent."""
    if not shutil.which("nvidia-smi"):
        return {}
    done = subprocess.run(["nvidia-smi", "--id=0", "--query-gpu=clocks.sm,power.draw",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10, check=False)
    try:
        clock, power = (float(x) for x in done.stdout.strip().split(","))
    except ValueError:
        return {}
    return {"sm_clock_mhz": clock, "power_w": power}


def measure_gemms(torch: Any, dev: str, gpu: str, quick: bool, min_s: float) -> list[dict[str, Any]]:
    """Every model's layer GEMMs at every token count, and the squares: measured vs the planner's TFLOP/s."""
    scale = 64 if quick else 1  # tiny shapes on CPU: the same code path, seconds not minutes
    shapes: list[tuple[str, str, int, int, int]] = []
    for name, h, a, kv, f, mats, tp in MODELS[:1] if quick else MODELS:
        for tokens in TOKENS[:1] if quick else TOKENS:
            shapes += [(f"{name}-tp{tp}", op, m, k, n) for op, m, k, n in layer_gemms(h, a, kv, f, mats, tp, tokens)]
    shapes += [("square", f"{s}^3", s, s, s) for s in (SQUARES[-1:] if quick else SQUARES)]
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    out = []
    for model, op, m, k, n in shapes:
        m_, k_, n_ = max(1, m // scale), max(1, k // scale), max(1, n // scale)
        a = torch.randn(m_, k_, device=dev, dtype=dtype)
        b = torch.randn(k_, n_, device=dev, dtype=dtype)
        seconds = time_op(torch, dev, lambda a=a, b=b: torch.matmul(a, b), min_s)
        measured = 2 * m_ * k_ * n_ / seconds / 1e12
        predicted = planner_gemm_tflops(gpu, m_, k_, n_)
        out.append({"model": model, "op": op, "m": m_, "k": k_, "n": n_, "measured_tflops": round(measured, 3),
                    "planner_tflops": round(predicted, 3), "planner_error": round(predicted / measured - 1, 4)})
        print(f"{model:18s} {op:9s} {m_:6d} x {k_:6d} x {n_:6d}  measured {measured:8.1f}  planner "
              f"{predicted:8.1f} TFLOP/s ({predicted / measured - 1:+.1%})", flush=True)
    return out


def measure_sustained(torch: Any, dev: str, seconds: float, quick: bool) -> list[dict[str, Any]]:
    """One 8192^3 GEMM back to back for `seconds`: TFLOP/s, SM clock and power per 2-s window."""
    size = 128 if quick else 8192
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    a = torch.randn(size, size, device=dev, dtype=dtype)
    b = torch.randn(size, size, device=dev, dtype=dtype)
    windows, start, window_s = [], time.perf_counter(), min(2.0, seconds)
    while time.perf_counter() - start < seconds:
        t0, count = time.perf_counter(), 0
        while time.perf_counter() - t0 < window_s:
            for _ in range(8):
                torch.matmul(a, b)
            _sync(torch, dev)
            count += 8
        elapsed = time.perf_counter() - t0
        row = {"t_s": round(time.perf_counter() - start, 2),
               "tflops": round(2 * size**3 * count / elapsed / 1e12, 3), **gpu_reading()}
        windows.append(row)
        print(f"sustained {size}^3 at {row['t_s']:6.1f} s: {row['tflops']:8.1f} TFLOP/s {row}", flush=True)
    return windows


def measure_attention(torch: Any, dev: str, gpu: str, quick: bool, min_s: float) -> list[dict[str, Any]]:
    """Causal SDPA per fused backend, head dim 128 and 64, fwd and fwd+bwd, vs the planner's flash rate."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"math": SDPBackend.MATH} if dev == "cpu" else {"flash": SDPBackend.FLASH_ATTENTION,
                                                              "cudnn": SDPBackend.CUDNN_ATTENTION}
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    catalog = get_gpu(gpu)
    plateau = DEFAULT_EFFICIENCY.fraction("flash", catalog.achieved)
    peak = catalog.peak("bf16")
    seqs, tokens = ((64, 128), 256) if quick else (ATTN_SEQS, ATTN_TOKENS)
    out = []
    for backend, kind in backends.items():
        for head_dim in (128,) if quick else (128, 64):
            heads = 16 if head_dim == 128 else 32  # hidden 2048 either way
            for seq in seqs:
                batch = max(1, tokens // seq)
                q, k, v = (torch.randn(batch, heads, seq, head_dim, device=dev, dtype=dtype, requires_grad=True)
                           for _ in range(3))
                flops_fwd = 4 * batch * heads * seq * seq * head_dim / 2  # causal: half the square
                row: dict[str, Any] = {"backend": backend, "head_dim": head_dim, "seq": seq, "batch": batch}
                try:
                    with sdpa_kernel(kind):
                        def fwd(q: Any = q, k: Any = k, v: Any = v) -> Any:
                            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

                        def fwd_bwd() -> None:
                            fwd().sum().backward()

                        t_fwd = time_op(torch, dev, fwd, min_s)
                        t_all = time_op(torch, dev, fwd_bwd, min_s)
                except RuntimeError as e:  # this backend does not run this shape here
                    row["error"] = str(e).splitlines()[0][:200]
                    out.append(row)
                    print(f"attention {backend} d{head_dim} s{seq}: {row['error']}", flush=True)
                    continue
                row["fwd_tflops"] = round(flops_fwd / t_fwd / 1e12, 3)
                row["fwd_bwd_tflops"] = round(3.5 * flops_fwd / t_all / 1e12, 3)  # backward = 2.5x forward
                row["planner_tflops"] = round(flash_rate_fraction(plateau, seq) * peak / 1e12, 3)
                out.append(row)
                print(f"attention {backend:5s} d{head_dim:3d} s{seq:6d}: fwd {row['fwd_tflops']:7.1f}  fwd+bwd "
                      f"{row['fwd_bwd_tflops']:7.1f}  planner {row['planner_tflops']:7.1f} TFLOP/s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the three measurements and write the JSON; 2 on a bad option."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="H200", help="catalog GPU whose planner figures to compare with")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--sustain-s", type=float, default=60.0, help="seconds of the sustained GEMM (0: skip)")
    parser.add_argument("--min-s", type=float, default=0.05, help="seconds one timed batch lasts at least")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a check of the script, e.g. on CPU)")
    parser.add_argument("--out", type=Path, help="result JSON (default: $OUT/gemm_shapes.json or bench/results)")
    args = parser.parse_args(argv)
    try:
        get_gpu(args.gpu)
    except Exception as e:  # the catalog's own one-line error
        print(f"error: {e}", file=sys.stderr)
        return 2
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU; use --device cpu --quick to check the script",
              file=sys.stderr)
        return 2
    card = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    result = {"card": card, "planner_gpu": args.gpu, "torch": torch.__version__,
              "cuda": torch.version.cuda, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "before": gpu_reading()}
    result["gemms"] = measure_gemms(torch, args.device, args.gpu, args.quick, args.min_s)
    result["attention"] = measure_attention(torch, args.device, args.gpu, args.quick, args.min_s)
    result["sustained"] = measure_sustained(torch, args.device, args.sustain_s, args.quick) if args.sustain_s > 0 \
        else []
    slug = card.replace(" ", "-").replace("/", "-")
    write_result(result, result_path(args.out, "gemm_shapes.json", f"gemm-shapes-{{date}}-{slug}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
