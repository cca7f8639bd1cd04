"""Feeding a rank: data loaders over a partition, or a pool of batches made on the device."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from musubi.contract.errors import ConfigError
from musubi.contract.world import World
from musubi.tasks.base import Task
from musubi.worker.feed.loader_plan import LoaderPlan, plan_loader
from musubi.worker.feed.prefetch import DevicePrefetcher
from musubi.worker.feed.sampler import ResumableDistributedSampler, ShardedEvalSampler

log = logging.getLogger(__name__)

#: Distinct on-device batches cycled by `synthetic.on_device` (enough to avoid a constant input).
DEVICE_POOL = 4


def channels_last(batch: Any) -> Any:
    """Images (4-D tensors) of a batch in channels-last layout, the rest untouched."""
    if isinstance(batch, torch.Tensor):
        return batch.contiguous(memory_format=torch.channels_last) if batch.dim() == 4 else batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(channels_last(b) for b in batch)
    return batch


class BatchPreparer:
    """One host batch, tagged with its epoch, made ready on the device (the task's train_batch; channels-last).

    An object of its own, not a method of TrainFeed: a prefetcher holding the feed's bound method is a
    reference cycle, and a DataLoader freed by the garbage collector's cycle pass, not by its reference
    count, waits out DataLoader's 5 s join timeout for each worker (BENCHMARKS.md, data). Runs and
    bench/data.py end the workers explicitly (TrainFeed.close); without the
    cycle a feed dropped without close() still frees them at once.
    """

    def __init__(self, task: Task, device: torch.device, nhwc: bool) -> None:
        self.task, self.device, self.nhwc = task, device, nhwc

    def __call__(self, tagged: tuple[int, Any]) -> tuple[int, Any]:
        epoch, host_batch = tagged  # the batch's own epoch seeds its augmentations, also when read ahead
        b = self.task.train_batch(host_batch, self.device, epoch)
        return epoch, channels_last(b) if self.nhwc else b


class HostEpochs:
    """The loader's host batches from (epoch, micro-batch) on, through the last epoch, each tagged with its epoch.

    Each epoch starts where the loader's order is defined (the sampler's position, the private generator's
    seed), so a batch is the same whether it was read ahead across the boundary or after a restart. Not a
    TrainFeed method: the prefetch thread iterates it and must not hold the feed (see BatchPreparer).
    """

    def __init__(self, loader: DataLoader, sampler: ResumableDistributedSampler, generator: torch.Generator,
                 seed: int, batch: int) -> None:
        self.loader, self.sampler, self.generator, self.seed, self.batch = loader, sampler, generator, seed, batch
        #: The loader's iterator of the epoch being read (its worker processes); None before the first.
        self.current: Any = None

    def read(self, epoch: int, micro: int, end: int) -> Iterator[tuple[int, Any]]:
        """(epoch, host batch) from micro-batch `micro` of `epoch` to the end of epoch `end` - 1."""
        while epoch < end:
            self.sampler.set_position(epoch, micro * self.batch)
            # A private generator: DataLoader would otherwise draw worker seeds from the
            # global RNG at every iter(), which a resumed run would draw at another time.
            self.generator.manual_seed(self.seed * 7919 + epoch)
            self.current = iter(self.loader)
            for host in self.current:
                yield epoch, host
            epoch, micro = epoch + 1, 0


class TrainFeed:
    """This rank's training micro-batches, epoch by epoch, resumable at any micro-batch."""

    def __init__(self, task: Task, world: World, batch: int, seed: int, workers: int | str, pin: bool,
                 nhwc: bool = False) -> None:
        self.task, self.world, self.batch, self.nhwc = task, world, batch, nhwc
        # Telemetry marks the host-to-device copy through this (the recorder's `section`; no-op by default).
        self.section: Callable[[str], None] = lambda name: None
        # Called in the wait for each batch, before its copy (fault injection: `data_stall`).
        self.before_batch: Callable[[], None] = lambda: None
        spec = task.spec
        syn = spec.data.synthetic
        self.on_device = bool(syn and syn.on_device)
        if self.on_device:
            assert syn is not None
            gen = torch.Generator(device=world.device)
            self.pool = []
            for k in range(DEVICE_POOL):
                gen.manual_seed(syn.seed * 1_000_003 + world.rank * 101 + k)
                b = task.device_batch(batch, world.device, gen)
                self.pool.append(channels_last(b) if nhwc else b)
            self.micro_per_epoch = syn.train_size // (batch * world.size)
            self.dataset_size = syn.train_size
        else:
            ds: Dataset = task.train_dataset()
            self.dataset_size = len(ds)  # type: ignore[arg-type]
            self.sampler = ResumableDistributedSampler(ds, world.size, world.rank, seed)
            #: samples/s per worker count tried (`data.workers: measure`), else None.
            self.measured: dict[int, float] | None = None
            if workers == "measure":
                from musubi.worker.feed.loader_plan import auto_workers
                from musubi.worker.feed.loader_probe import measure_workers

                workers, self.measured = measure_workers(ds, task.collate, batch, auto_workers(
                    int(os.environ.get("LOCAL_WORLD_SIZE", "1"))), spec.data.prefetch, pin and world.is_cuda,
                    seed=seed)
                task.spec.data.workers = workers  # validation and restarts of this process reuse the count
            self.generator = torch.Generator()  # the loader's worker seeds (HostEpochs.read seeds it an epoch)
            # Workers (auto: this rank's cores), pinning, prefetch and persistence from data.* (loader_plan).
            self.plan = plan_loader(workers, pin, spec.data.prefetch, spec.data.persistent_workers, world.is_cuda)
            self.preparer = BatchPreparer(task, world.device, nhwc)
            self.prefetcher = DevicePrefetcher(self.preparer, world.device)
            self.plan = dataclasses.replace(self.plan, path={**task.feed_path(),
                                                             "ahead": self.prefetcher.describe()})
            if world.is_main:
                p = self.plan
                log.info("feeder: %s; device batches %s", feeder_line(p, world.is_cuda), p.path["ahead"])
            self.loader = DataLoader(ds, batch_size=batch, sampler=self.sampler, collate_fn=task.collate,
                                     drop_last=True, generator=self.generator, **self.plan.kwargs())
            self.micro_per_epoch = len(self.sampler) // batch
            self.seed = seed
            self.reader = HostEpochs(self.loader, self.sampler, self.generator, seed, batch)
            #: The prepared-batch stream (prefetch thread) and the position, epoch * micro_per_epoch + micro, of the
            #: next batch it yields: it runs on across epoch boundaries (see epoch()).
            self._stream: Iterator[tuple[int, Any]] | None = None
            self._next = 0
            self._stream_end = 0
        if self.micro_per_epoch < 1:
            raise ConfigError(
                f"train set of {self.dataset_size} samples gives no full batch at {batch} per rank x "
                f"{world.size} ranks; lower train.batch or --nproc, or add data"
            )

    def epoch(self, epoch: int, start_micro: int) -> Iterator[Any]:
        """Device batches of `epoch`, from micro-batch `start_micro` to the end of the epoch.

        The prepared-batch stream outlives the epoch: while the epoch's last steps run, the prefetch thread
        already reads and prepares the next epoch's first batches (the loader's workers start on them as soon
        as this epoch's files are read), so the step after the boundary does not wait for a cold start.
        """
        if self.on_device:
            for i in range(start_micro, self.micro_per_epoch):
                self.before_batch()
                yield self.pool[(epoch * self.micro_per_epoch + i) % DEVICE_POOL]
            return
        stream = self._stream_at(epoch, start_micro)
        for _ in range(start_micro, self.micro_per_epoch):
            tagged = next(stream, None)
            if tagged is None:  # the stream ended: only after the last epoch of train.epochs
                return
            assert tagged[0] == epoch, f"prepared-batch stream at epoch {tagged[0]}, wanted {epoch}"
            self._next += 1
            self.before_batch()
            self.section("h2d")  # on a CUDA rank: the training stream's wait for the batch prepared ahead
            yield tagged[1]

    def _stream_at(self, epoch: int, micro: int) -> Iterator[tuple[int, Any]]:
        """The prepared-batch stream positioned at (epoch, micro): the running one where it is there or a few
        batches short of it (the micro-batches an epoch leaves over that fill no optimizer step), else a new one."""
        wanted = epoch * self.micro_per_epoch + micro
        skip = wanted - self._next
        if self._stream is not None and 0 <= skip <= self.prefetcher.depth and wanted < self._stream_end:
            for _ in range(skip):  # already prepared (or nearly): dropped, as a restart would drop them
                next(self._stream, None)
        else:
            self._end_stream()
            end = max(self.task.spec.train.epochs, epoch + 1)  # nothing is read past the run's last epoch
            self._stream = self.prefetcher.batches(self.reader.read(epoch, micro, end))
            self._stream_end = end * self.micro_per_epoch
        self._next = wanted
        return self._stream

    def _end_stream(self) -> None:
        """Stop the prefetch thread (it may be preparing the next epoch's batches)."""
        stream, self._stream = getattr(self, "_stream", None), None
        if stream is not None:
            stream.close()  # type: ignore[attr-defined]

    def calibration_batches(self, count: int) -> Iterator[Any]:
        """The first `count` micro-batches of epoch 0 on this rank (fewer if an epoch has fewer), made ready as
        for training (worker/bn_stats.py's batches).

        Read apart from the training stream, in this process (no loader workers to start): the training
        loader's position, workers, clocks and injected stalls stay as they are, and the same weights always
        meet the same batches (a stopped and resumed run validates like an uninterrupted one).
        """
        count = min(count, self.micro_per_epoch)
        if self.on_device:
            for i in range(count):
                yield self.pool[i % DEVICE_POOL]
            return
        ds = self.loader.dataset
        order = ResumableDistributedSampler(ds, self.world.size, self.world.rank, self.seed)
        order.set_position(0, 0)
        picked = list(order)[: count * self.batch]
        loader = DataLoader(Subset(ds, picked), batch_size=self.batch, collate_fn=self.task.collate, drop_last=True)
        for host in loader:
            b = self.task.train_batch(host, self.world.device, 0)
            yield channels_last(b) if self.nhwc else b

    def times(self) -> dict[str, dict[str, float]]:
        """Per-batch time of each stage, in the order a batch meets them (summary.json's loader.times).

        read: the prefetch thread waiting for the loader's workers; sync: waiting for the side stream's
        previous batch; decode, convert (to float, resize, tiles), augment, h2d (targets): the task's stages;
        prepare: all of train_batch; wait: the training loop blocked for the next device batch.
        """
        if self.on_device:
            return {}
        stages = {**self.task.feed_times(), **self.prefetcher.clock.record()}
        order = ("read", "sync", "decode", "convert", "augment", "h2d", "prepare", "wait")
        return {k: stages[k] for k in sorted(stages, key=lambda k: order.index(k) if k in order else len(order))}

    def close(self) -> None:
        """End the training loader's worker processes now, not when the garbage collector finds them.

        A persistent iterator left to `gc.collect()` is shut down from inside the collection, after its
        index queue may already have been finalised: the worker never receives the stop message and
        DataLoader waits out its 5 s join timeout before killing it: most of a short run's exit without
        close() (BENCHMARKS.md, data). Lightning ends workers the same way
        (`_shutdown_workers_and_reset_iterator`); the method is torch's, unchanged from 2.6 to 2.14.
        """
        self._end_stream()  # first: the prefetch thread may be reading from the workers
        reader = getattr(self, "reader", None)
        it = reader.current if reader is not None else None
        if reader is not None:
            reader.current = None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        loader = getattr(self, "loader", None)
        if loader is not None and hasattr(loader, "_iterator"):
            loader._iterator = None

    def worker_pids(self) -> list[int]:
        """The process ids of the training loader's workers now (none: no workers, or no epoch started)."""
        reader = getattr(self, "reader", None)
        return [w.pid for w in getattr(getattr(reader, "current", None), "_workers", None) or [] if w.pid]


def feeder_line(p: LoaderPlan, is_cuda: bool) -> str:
    """Where the feed's stages run and how the loader is shaped, for the rank-0 feeder line."""
    stages = ("decode", "resize", "augment")
    # pinned: page-locked host memory for the copy to a GPU (a CPU rank copies nothing: not said)
    memory = "" if not is_cuda else ", pinned host memory" if p.pin_memory else ", pageable host memory"
    if p.workers:
        return (f"{'; '.join(f'{k} {p.path[k]}' for k in stages)}; {p.workers} loader worker(s) ({p.source}), "
                f"prefetch {p.prefetch} a worker{memory}")
    # Without workers the rank's own process does the workers' part: say so, not "loader workers".
    in_rank = [k for k in stages if p.path[k] == "loader workers"]
    rest = [f"{k} {p.path[k]}" for k in stages if k not in in_rank]
    return "; ".join(([f"{', '.join(in_rank)} in the rank (no loader worker)"] if in_rank else
                      ["no loader worker"]) + rest) + memory


class ValFeed:
    """This rank's share of the validation set, without padding (no sample counted twice)."""

    def __init__(self, task: Task, world: World, batch: int, workers: int | str, pin: bool) -> None:
        self.task, self.world = task, world
        ds = task.val_dataset()
        self.loader: DataLoader | None = None
        self.size = 0
        if ds is None or len(ds) == 0:  # type: ignore[arg-type]
            return
        self.size = len(ds)  # type: ignore[arg-type]
        sampler = ShardedEvalSampler(self.size, world.size, world.rank)
        plan = plan_loader(workers, pin, task.spec.data.prefetch, False, world.is_cuda)
        self.loader = DataLoader(ds, batch_size=batch, sampler=sampler, collate_fn=task.collate, drop_last=False,
                                 **plan.kwargs())

    def __bool__(self) -> bool:
        return self.loader is not None

    def __len__(self) -> int:
        return 0 if self.loader is None else len(self.loader)

    def batches(self) -> Iterator[Any]:
        """Device batches of this rank's shard."""
        assert self.loader is not None
        for host_batch in self.loader:
            yield self.task.to_device(host_batch, self.world.device)
