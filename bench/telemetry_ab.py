"""Telemetry's cost inside one process: blocks of steps with each part of it on or off, interleaved.

Why: `bench/watchtower.py --part overhead` compares separate runs (musubi with telemetry on, off, plain DDP).
On 2x H200 (2026-11-27) two runs of one program differed by up to 11 % for fcos (1 GPU, 100-step windows), so
two repeats could not tell a 1 % cost from none, and the median said 3.4-3.8 %. Here one process trains the
reference step (plain_ddp.py's model, data and optimizer: resnet50 bs256 or fcos bs16, bf16, data on the GPU;
DDP wrapped as musubi wraps it, gradients inside the buckets) and turns telemetry's parts on and off between
blocks of --block steps, so the run's own speed (its cuDNN choices, clocks, memory layout) is the same for
every mode. Each cycle runs every mode once, in a rotating order; a mode's cost is its block time over the
`off` block of the same cycle (paired), the median and spread over --cycles cycles.

Modes (the classes musubi's loop uses, musubi/telemetry):
- off         - no telemetry.
- spans_spin  - SpanRecorder sections data, h2d, forward, backward, optimizer and a step record, with CUDA
                events made as musubi made them before 2026-11-27 (default flags: the writer thread's
                `Event.synchronize` spin-waits a core for most of every step).
- spans       - the same with the recorder as it is now.
- sampler     - the NVML/psutil sampler thread at the job default (2 Hz).
- on          - spans + sampler, and at 2+ ranks rank 0's straggler watch reading every rank's records (a
                `musubi train` with telemetry on, less the DDP comm hook that marks the last gradient bucket).
- hook        - musubi's comm hook alone (telemetry/comm_hook.attach: DDP's all-reduce called from Python once
                per bucket, a CUDA event at the last). A DDP model takes one hook for its whole life, so these
                blocks train a second DDP model, a copy of the first (same weights, data and optimizer).
- full        - the copy with its hook, spans, sampler and watch: all of `musubi train`'s telemetry.
- copy        - (opt-in) a third copy of the model, no hook, no telemetry: the control for `hook`, whose
                blocks train other tensors than `off`'s. On 2 CPU ranks (2026-11-27, 30 cycles) hook +3.1 %,
                copy +0.4 %: any comm hook makes DDP leave the division by the world size to the hook, a scan
                of the gradients that DDP otherwise folds into copying them into its buckets (BENCHMARKS.md,
                session 14).
- sampler_proc - (opt-in) the sampler in a process of its own, sampling this rank from outside (the class's pid
                mode, as the fleet samples an external command): its Python takes no GIL of the training process.
- watch       - (opt-in) spans + rank 0's straggler watch, no sampler (at 2+ ranks).
- on_proc     - (opt-in) `on` with the sampler in its own process.

A block begins and ends with one `torch.cuda.synchronize()` (the same for every mode); the sampler is
started before and closed after the timed block. Run under torchrun, one rank per GPU:

    torchrun --nproc-per-node 1 bench/telemetry_ab.py fcos --cycles 8 --json $OUT/ab-fcos.json

CPU rehearsal (resnet18 at 32 px, gloo): `torchrun --nproc-per-node 1 bench/telemetry_ab.py resnet50 --cpu`;
`--cpu-model squeezenet1_1` (any torchvision classifier) stands in a smaller one: what tests/diagnose runs, where
resnet18's 11.7 M parameters made a step ~1 s on the shared 2-core machine, most of the test's time.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.paired_blocks import add_block_options, chosen_modes, paired_rows, report  # noqa: E402
from bench.watchtower import rank_cpus  # noqa: E402
from musubi.config.job import TelemetrySpec  # noqa: E402
from musubi.contract.env import MUSUBI_CPUS  # noqa: E402
from musubi.telemetry.comm_hook import attach  # noqa: E402
from musubi.telemetry.sampler import Sampler, open_nvml_device  # noqa: E402
from musubi.telemetry.spans import SpanRecorder  # noqa: E402
from musubi.telemetry.straggler import default_threshold  # noqa: E402
from musubi.telemetry.watch import StragglerWatch  # noqa: E402
from musubi.worker.pinning import intra_op_threads, pin_rank  # noqa: E402

MODES = ("off", "spans_spin", "spans", "sampler", "on", "hook", "full", "copy", "sampler_proc", "watch", "on_proc")
DEFAULT_MODES = MODES[:7]
#: The sampler in a process of its own (opt-in `sampler_proc`, `on_proc`): the same class sampling this rank from
#: outside (pid mode, as the fleet samples an external command), so its Python never takes this process's GIL.
#: Stops when its stdin closes.
SAMPLER_CHILD = """
import sys
from pathlib import Path
from musubi.telemetry.sampler import Sampler, open_nvml_index
path, rank, hz, index, pid = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
s = Sampler(path, rank, hz, open_nvml_index(index) if index >= 0 else None, pid=pid)
print("ready", flush=True)
sys.stdin.read()
s.close(last_sample=False)
"""
SAMPLE_HZ = TelemetrySpec().sample_hz  # the job default


class SpinEventRecorder(SpanRecorder):
    """The recorder with default-flag CUDA events, as musubi made them before 2026-11-27."""

    def _boundary(self):  # noqa: ANN202 - SpanRecorder's Boundary
        ev = None
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        return time.perf_counter_ns(), ev


def build(model: str, batch: int | None, device: torch.device, cpu: bool, cpu_model: str = "resnet18"):
    """plain_ddp.py's model, data and loss (smaller on CPU: `cpu_model` for resnet50); returns (module, step_loss,
    per-GPU batch)."""
    # Imported here, not at the top: torchvision pulls in torch._dynamo (seconds of CPU), which a refused
    # command line need not pay.
    import torchvision

    amp = torch.autocast("cuda", dtype=torch.bfloat16) if not cpu else torch.autocast("cpu", dtype=torch.bfloat16)
    if model == "resnet50":
        batch = batch or (8 if cpu else 256)
        side = 32 if cpu else 224
        m = (torchvision.models.get_model(cpu_model) if cpu else torchvision.models.resnet50())
        m = m.to(device, memory_format=torch.channels_last)
        x = torch.randn(batch, 3, side, side, device=device).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=device)
        lossf = torch.nn.CrossEntropyLoss()

        def step_loss(mod):
            with amp:
                return lossf(mod(x), y)
        return m, step_loss, batch
    batch = batch or (2 if cpu else 16)
    side = 64 if cpu else 640
    kw = {"min_size": 64, "max_size": 64} if cpu else {}
    m = torchvision.models.detection.fcos_resnet50_fpn(weights=None, weights_backbone=None, num_classes=8,
                                                       **kw).to(device)
    imgs = [torch.rand(3, side, side, device=device) for _ in range(batch)]
    tg = []
    for _ in range(batch):
        xy = torch.rand(6, 2, device=device) * (side * 0.78)
        wh = torch.rand(6, 2, device=device) * (side * 0.19) + 8
        tg.append({"boxes": torch.cat([xy, xy + wh], 1), "labels": torch.randint(1, 8, (6,), device=device)})

    def step_loss(mod):
        with amp:
            return sum(mod(imgs, tg).values())
    return m, step_loss, batch


def pin(local: int) -> int:
    """Pin this rank as `musubi train` pins it, before any thread pool or process group: its equal share of the
    allowed cores (bench/watchtower.py's rank_cpus, the sets MUSUBI_CPUS gets), every thread; torch's intra-op
    threads from that share. The cores it got."""
    sets = rank_cpus(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    pinned = pin_rank(local, {MUSUBI_CPUS: ";".join(sets)})
    cores = pinned.cores if pinned is not None else len(os.sched_getaffinity(0))
    torch.set_num_threads(intra_op_threads(cores, 0))
    return cores


class BlockWatch(StragglerWatch):
    """Rank 0's straggler watch whose thread runs during its mode's blocks only, its state kept between them."""

    def __init__(self, folder: Path, world: int, threshold: float) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        super().__init__(folder, world, threshold, start=False)

    def pause(self) -> None:
        """The block's last records read, the thread stopped (StragglerWatch.close)."""
        self.close()

    def resume(self) -> None:
        self.start()


class SamplerProcess:
    """`SAMPLER_CHILD` started for one block: sampling this process and its GPU from outside."""

    def __init__(self, path: Path, rank: int, hz: float, nvml_index: int) -> None:
        import subprocess

        path.parent.mkdir(parents=True, exist_ok=True)
        self.p = subprocess.Popen([sys.executable, "-c", SAMPLER_CHILD, str(path), str(rank), str(hz),
                                   str(nvml_index), str(os.getpid())], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        if "ready" not in (self.p.stdout.readline() if self.p.stdout else ""):
            raise RuntimeError(f"sampler process did not start (exit {self.p.poll()})")

    def close(self, last_sample: bool = False) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        self.p.wait(10)


def sampler_cost(work: Path) -> dict[str, Any]:
    """What one sample cost the sampler (its `self_ms`: CPU time of the sampling thread), per mode's folder (`on`,
    `full`, `sampler`: a thread of the rank; `sampler_proc`, `on_proc`: a process of its own), every rank's files."""
    return {d.name: cost for d in sorted(p for p in work.iterdir() if p.is_dir())
            if (cost := _sampler_cost(d)) is not None}


def _sampler_cost(folder: Path) -> dict[str, Any] | None:
    vals = []
    for f in sorted(folder.glob("sampler-rank*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                v = json.loads(line).get("self_ms")
            except ValueError:
                continue
            if isinstance(v, (int, float)):
                vals.append(float(v))
    if not vals:
        return None
    vals.sort()
    return {"samples": len(vals), "median": round(statistics.median(vals), 3),
            "p95": round(vals[min(len(vals) - 1, int(0.95 * len(vals)))], 3), "max": round(vals[-1], 3)}


def cpu_models() -> list[str]:
    """The torchvision classifiers `--cpu-model` may name."""
    import torchvision

    return torchvision.models.list_models(module=torchvision.models)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=("resnet50", "fcos"))
    ap.add_argument("--batch", type=int, default=None, help="per-GPU batch (default: the reference's)")
    ap.add_argument("--cpu-model", default="resnet18",
                    help="with --cpu, the torchvision classifier that stands in for resnet50 (at 32 px)")
    add_block_options(ap, MODES, DEFAULT_MODES, block=15, cpu_help="rehearsal on CPU (gloo)")
    args = ap.parse_args()
    modes = chosen_modes(args.modes, "off", MODES)
    if args.cpu and args.cpu_model not in cpu_models():
        raise SystemExit(f"--cpu-model {args.cpu_model}: not a torchvision classifier; give one such as resnet18 "
                         "or squeezenet1_1")

    local = int(os.environ.get("LOCAL_RANK", 0))
    cores = pin(local)
    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        torch.backends.cudnn.benchmark = True
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model, step_loss, batch = build(args.model, args.batch, device, args.cpu, args.cpu_model)
    ids = None if args.cpu else [local]

    def net(m: torch.nn.Module, hook: SpanRecorder | None = None) -> tuple[Any, torch.optim.Optimizer]:
        """(DDP model, optimizer) of `m`, wrapped as musubi wraps a model (worker/wrap.py: gradients inside the
        buckets), with musubi's comm hook marking on `hook` when given. The loop below clears gradients to None
        as musubi's does, so each backward's fresh gradients are copied into the buckets: without a hook DDP
        divides by the world size in that copy, with one the hook divides in a pass of its own."""
        ddp_ = torch.nn.parallel.DistributedDataParallel(m, device_ids=ids, gradient_as_bucket_view=True)
        if hook is not None:
            attach(ddp_, hook)
        return ddp_, torch.optim.SGD(ddp_.parameters(), lr=0.01, momentum=0.9)

    sync = (lambda: None) if args.cpu else torch.cuda.synchronize
    # One folder for every rank (one node), as a job's telemetry/ is: rank 0's watch reads all ranks' files.
    where = [tempfile.mkdtemp(prefix="musubi-ab-") if rank == 0 else None]
    dist.broadcast_object_list(where, src=0)
    work = Path(where[0])
    # Each mode that records writes a folder of its own, in the layout the straggler watch reads (rank{r}.jsonl,
    # sampler-rank{r}.jsonl): a watch reads only its own mode's records.
    folders = {m: work / m for m in ("spans", "on", "full", "sampler", "watch", "sampler_proc", "on_proc")}
    recorders = {"spans_spin": SpinEventRecorder(work / "spin" / f"rank{rank}.jsonl", rank, device)}
    recorders.update({m: SpanRecorder(folders[m] / f"rank{rank}.jsonl", rank, device)
                      for m in ("spans", "on", "watch", "on_proc") if m in modes})
    # The copies are made before any is wrapped: the same weights. "hook" blocks: the hook marks on the "full"
    # recorder, which nobody opens sections on then.
    twin = copy.deepcopy(model) if {"hook", "full"} & set(modes) else None
    control = copy.deepcopy(model) if "copy" in modes else None
    plain = net(model)
    hooked = plain_copy = None
    if twin is not None:
        recorders["full"] = SpanRecorder(folders["full"] / f"rank{rank}.jsonl", rank, device)
        hooked = net(twin, recorders["full"])
    if control is not None:
        plain_copy = net(control)
    nvml = None if args.cpu else open_nvml_device(local)

    def train(n: int, rec: SpanRecorder | None, first: int, pair: tuple[Any, torch.optim.Optimizer]) -> None:
        ddp_, opt_ = pair
        for k in range(first, first + n):
            if rec is not None:
                rec.section("data")
                rec.section("h2d")
                rec.section("forward")
            opt_.zero_grad(set_to_none=True)
            loss = step_loss(ddp_)
            if rec is not None:
                rec.section("backward")
            loss.backward()
            if rec is not None:
                rec.section("optimizer")
            opt_.step()
            if rec is not None:
                rec.step_done(k)

    # One watch per mode for the whole run, its thread running during that mode's blocks only: it reads each
    # block's new records and its detector holds a full window across blocks, as a job's watch does in steady
    # state. (A new watch each block re-read its folder from the start and fed every step again: its cost grew
    # with the run, from 0 to +30 % of fcos's step at 4 ranks by the 14th cycle, 4x H200, 2026-11-27.)
    watches = {m: BlockWatch(folders[m], world, default_threshold(None, not args.cpu))
               for m in ("on", "full", "watch", "on_proc") if m in modes and rank == 0 and world > 1}
    t_start = time.perf_counter()
    for pair in (plain, hooked, plain_copy):
        if pair is not None:
            train(args.warmup, None, 0, pair)
    sync()
    step = args.warmup
    per_mode: dict[str, list[float]] = {m: [] for m in modes}
    for c in range(args.cycles):
        order = modes[c % len(modes):] + modes[:c % len(modes)]  # each mode takes each place in turn
        for m in order:
            sampler = None
            if m in ("sampler_proc", "on_proc"):
                sampler = SamplerProcess(folders[m] / f"sampler-rank{rank}.jsonl", rank, SAMPLE_HZ,
                                         nvml.index if nvml is not None else -1)
            elif m in ("on", "full", "sampler"):
                sampler = Sampler(folders[m] / f"sampler-rank{rank}.jsonl", rank, SAMPLE_HZ, nvml)
            watch = watches.get(m)
            if watch is not None:
                watch.resume()
            rec = recorders.get(m)
            if rec is not None:
                rec.section("log")  # a block starts mid-stream, as every step after the first does
            sync()
            t0 = time.perf_counter()
            train(args.block, rec, step, hooked if m in ("hook", "full") else plain_copy if m == "copy" else plain)
            sync()
            dt = torch.tensor([time.perf_counter() - t0], device=device)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            per_mode[m].append(dt.item() / args.block * 1e3)
            if rec is not None:
                rec.pause()
            if sampler is not None:
                sampler.close(last_sample=False)
            if watch is not None:
                watch.pause()
            step += args.block
    for r in {id(r): r for r in recorders.values()}.values():
        r.close()
    if rank == 0:
        rows = paired_rows(per_mode, "off")
        out = {"model": args.model, "cpu_model": args.cpu_model if args.cpu and args.model == "resnet50" else None,
               "world": world, "per_gpu_batch": batch, "block_steps": args.block,
               "cycles": args.cycles, "warmup": args.warmup, "cores_per_rank": cores,
               "device": torch.cuda.get_device_name(device) if not args.cpu else "cpu",
               "torch": torch.__version__, "commit": os.environ.get("MUSUBI_COMMIT", ""),
               "wall_s": round(time.perf_counter() - t_start, 1), "modes": rows,
               "sampler_self_ms": sampler_cost(work),
               # windows the detector scored and steps it skipped (a complete window needs WARMUP + WINDOW steps)
               "watch": {m: {"windows": w.detector.windows, "skipped": w.skipped} for m, w in watches.items()}}
        report(f"{args.model} x{world}", rows, out, args.json)
    plain = hooked = plain_copy = None  # the DDP wrappers go before destroy_process_group (gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
