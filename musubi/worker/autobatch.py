"""`batch: auto`: probe the largest per-rank batch that fits, on every rank at once, and agree.

Each rank runs real training steps (forward + backward + optimizer, the job's
precision and input size) on a throwaway copy of the model on its own device:
grow the batch by doubling until a step runs out of memory (or leaves less
than `headroom` of the GPU free), then bisect between the last fit and the
first failure. The trials use no collective (DDP's gradient buckets are the
gradients themselves, `gradient_as_bucket_view`), so a rank that runs out of
memory never strands a peer in an all-reduce; the ranks agree on the minimum
of their results with one all-reduce at the end. Mixed GPU models are fine:
each rank measures its own.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from musubi.contract.errors import ConfigError
from musubi.contract.inject import Injector, injected_oom
from musubi.contract.world import World
from musubi.recovery.memory import GIB, is_oom
from musubi.tasks.base import Task
from musubi.worker.feed.loaders import channels_last
from musubi.worker.precision import autocast, make_scaler

log = logging.getLogger("musubi.autobatch")

#: Largest batch ever tried: beyond this, throughput gains are nil and steps become seconds long.
MAX_PROBE_BATCH = 4096


@dataclass
class ProbeResult:
    """What the probe found on this rank, and what all ranks agreed on."""

    batch: int                      # agreed per-rank batch (minimum over ranks)
    local_batch: int                # this rank's own largest fitting batch
    peak_gib: float | None          # peak allocated at `local_batch` (GPU only)
    total_gib: float | None         # device memory
    seconds: float
    trials: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain data for probe.json and the cache."""
        return asdict(self)


def _probe_batch_from(task: Task, size: int, device: torch.device, gen: torch.Generator,
                      dataset: Dataset | None) -> Any:
    """A batch of `size` samples: made on the device when the task can, else from the data set."""
    try:
        return task.device_batch(size, device, gen)
    except ConfigError:
        if dataset is None:
            raise
    n = len(dataset)  # type: ignore[arg-type]
    samples = [dataset[i % n] for i in range(size)]
    return task.to_device(task.collate(samples), device)


class _Trial:
    """Runs training steps at a given batch on a private model copy."""

    def __init__(self, task: Task, world: World, precision: str, optimizer_factory: Any, nhwc: bool,
                 injector: Injector) -> None:
        self.task, self.world, self.precision, self.nhwc, self.injector = task, world, precision, nhwc, injector
        model = task.build_model()
        if nhwc:
            model = model.to(memory_format=torch.channels_last)
        self.model = model.to(world.device).train()
        self.optimizer = optimizer_factory(self.model)
        self.scaler = make_scaler(precision, world.device)
        self.gen = torch.Generator(device=world.device)
        self.dataset: Dataset | None = None
        self.total = torch.cuda.mem_get_info(world.device)[1] if world.is_cuda else None

    def run(self, size: int, headroom: float) -> tuple[bool, float | None, str]:
        """(fits, peak GiB, why not) for `size` samples per step."""
        dev = self.world.device
        limit = self.injector.batch_limit()
        try:
            self.gen.manual_seed(size)
            if self.dataset is None:
                try:
                    batch = self.task.device_batch(size, dev, self.gen)
                except ConfigError:
                    self.dataset = self.task.train_dataset()
                    batch = _probe_batch_from(self.task, size, dev, self.gen, self.dataset)
            else:
                batch = _probe_batch_from(self.task, size, dev, self.gen, self.dataset)
            if self.nhwc:
                batch = channels_last(batch)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            # Two steps: the first creates the optimizer state, the second is the steady state.
            for _ in range(2):
                if limit is not None and size > limit:
                    raise injected_oom(f"probe at batch {size} > simulated limit {limit}")
                with autocast(self.precision, dev):
                    loss, _ = self.task.loss(self.model, batch)
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
            if dev.type != "cuda":
                return True, None, ""
            torch.cuda.synchronize(dev)
            peak = torch.cuda.max_memory_allocated(dev)
            assert self.total is not None
            if peak > (1.0 - headroom) * self.total:
                return False, peak / GIB, f"peak {peak / GIB:.1f} GiB leaves less than {headroom:.0%} free"
            return True, peak / GIB, ""
        except Exception as e:  # noqa: BLE001 - only OOMs are a probe outcome; the rest re-raise
            if not is_oom(e):
                raise
            return False, None, "out of memory"
        finally:
            batch = None  # noqa: F841 - drop the trial's tensors before the next size
            self.optimizer.zero_grad(set_to_none=True)
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()

    def close(self) -> None:
        """Free the private model and its optimizer state."""
        del self.model, self.optimizer
        gc.collect()
        if self.world.is_cuda:
            torch.cuda.empty_cache()


def probe_batch(task: Task, world: World, precision: str, optimizer_factory: Any, headroom: float,
                injector: Injector, cap: int, nhwc: bool = False, start: int = 2) -> ProbeResult:
    """Growth then bisection on every rank, then one all-reduce MIN: the batch every rank can run."""
    t0 = time.perf_counter()
    cap = max(1, min(cap, MAX_PROBE_BATCH))
    trial = _Trial(task, world, precision, optimizer_factory, nhwc, injector)
    trials: list[dict[str, Any]] = []
    peaks: dict[int, float | None] = {}

    def attempt(b: int) -> bool:
        ok, peak, why = trial.run(b, headroom)
        trials.append({"batch": b, "fits": ok, "peak_gib": None if peak is None else round(peak, 3), "why": why})
        if ok:
            peaks[b] = peak
        return ok

    try:
        good, bad = 0, None
        b = min(start, cap)
        while True:  # growth
            if attempt(b):
                good = b
                if b >= cap:
                    break
                b = min(b * 2, cap)
            else:
                bad = b
                break
        if good == 0:  # even the first size failed: walk down
            b = bad // 2 if bad else 0
            while b >= 1 and not attempt(b):
                bad, b = b, b // 2
            good = max(b, 0)
        if bad is not None:  # bisection between the last fit and the first failure
            lo, hi = good, bad
            while hi - lo > max(1, lo // 20):  # within 5 %
                mid = (lo + hi) // 2
                if attempt(mid):
                    lo = mid
                else:
                    hi = mid
            good = lo
    finally:
        trial.close()
    agreed = world.all_reduce_min(good)
    if agreed < 1:
        raise ConfigError(
            f"batch: auto found no batch that fits ({task.spec.model_label()}, precision {precision}); even one sample "
            "runs out of memory: use strategy fsdp, a smaller input or model"
        )
    total = trial.total / GIB if trial.total else None
    return ProbeResult(agreed, good, peaks.get(good), None if total is None else round(total, 2),
                       round(time.perf_counter() - t0, 2), trials)
