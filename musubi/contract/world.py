"""The one init site of distributed state, and the object that knows the world.

Every rank binds its device (`cuda:LOCAL_RANK`) before any other CUDA work, then
starts the process group here, with an explicit timeout. Everything else asks
the `World` for rank, size and device instead of reading the environment.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from musubi.contract.env import MUSUBI_CLIENT_PID
from musubi.contract.errors import ConfigError


@dataclass(frozen=True)
class World:
    """Who this process is among its peers, and which device it owns."""

    rank: int
    local_rank: int
    size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        """True on the rank that owns shared side effects (console, metrics, commits)."""
        return self.rank == 0

    @property
    def is_cuda(self) -> bool:
        """True when this rank trains on a GPU."""
        return self.device.type == "cuda"

    def barrier(self) -> None:
        """Wait for every rank (a no-op without a process group)."""
        if dist.is_initialized():
            dist.barrier()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over ranks, in place, and return it."""
        if dist.is_initialized() and self.size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_reduce_min(self, value: int) -> int:
        """The minimum of an integer over ranks (a decision every rank agrees on)."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        if dist.is_initialized() and self.size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def all_reduce_max(self, value: int) -> int:
        """The maximum of an integer over ranks."""
        return -self.all_reduce_min(-value)

    def broadcast_from_main(self, values: list[float]) -> list[float]:
        """Rank 0's floats on every rank (float64): an input every rank then decides on alike."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if dist.is_initialized() and self.size > 1:
            dist.broadcast(t, src=0)
        return t.tolist()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return default if raw is None else int(raw)


def _init_group(backend: str, timeout: dt.timedelta, device: torch.device | None) -> None:
    """init_process_group on torchrun's store, namespaced by restart attempt.

    After a coordinated restart the ranks of the new attempt must not read the
    addresses that the dead attempt published (seen here: a restarted rank
    connecting to its dead peer's port); a prefix per attempt keeps them apart.
    """
    if "MASTER_ADDR" not in os.environ:  # not under torchrun: a single local process
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
    store, rank, size = next(dist.rendezvous("env://", timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"musubi/attempt{attempt}", store)
    kwargs = {"device_id": device} if device is not None else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout, **kwargs)


def init_world(timeout_s: float, device_kind: str | None = None) -> World:
    """Bind this rank's device, then start the process group (the only place that does)."""
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    kind = device_kind or os.environ.get("MUSUBI_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    timeout = dt.timedelta(seconds=timeout_s)
    if kind == "cuda":
        visible = torch.cuda.device_count()
        if local_rank >= visible:
            raise ConfigError(
                f"rank {rank} has LOCAL_RANK={local_rank} but only {visible} GPU(s) are visible; "
                "lower --nproc or fix CUDA_VISIBLE_DEVICES"
            )
        device = torch.device("cuda", local_rank)
        # Bind before any CUDA work so no rank ever creates a context on GPU 0 by accident.
        torch.cuda.set_device(device)
        # gloo beside NCCL: CPU collectives (async checkpoint staging, object gathers) need it.
        backend = "cpu:gloo,cuda:nccl"
        if not dist.is_initialized():
            try:
                _init_group(backend, timeout, device)
            except dist.DistBackendError as e:
                # NCCL's eager init notices two ranks on one GPU before any check of ours can:
                # say it as the binding error it is (seen on 4x H200 with two torchrun agents).
                if "Duplicate GPU detected" in str(e):
                    detail = str(e).split("Duplicate GPU detected", 1)[1].split("\n")[0].strip(" :")
                    raise ConfigError(
                        f"two ranks share one GPU ({detail}); give each rank its own GPU: check "
                        "CUDA_VISIBLE_DEVICES (do not override it per rank), --nproc and --nnodes"
                    ) from None
                raise
    elif kind == "cpu":
        device = torch.device("cpu")
        backend = "gloo"
        if not dist.is_initialized():
            _init_group(backend, timeout, None)
    else:
        raise ConfigError(f"MUSUBI_DEVICE={kind!r}: use 'cuda' or 'cpu'")
    return World(rank=dist.get_rank(), local_rank=local_rank, size=dist.get_world_size(), device=device,
                 backend=backend)


_SIDE_GROUP: dist.ProcessGroup | None = None


def side_group() -> dist.ProcessGroup | None:
    """A second gloo group for collectives issued off the training thread (asynchronous checkpoints).

    Collectives of one group must be issued in the same order on every rank; a background
    thread's cannot be ordered against the training thread's (DDP all-reduces), so they get
    their own group. Collective on first call: every rank calls it at the same point.
    """
    global _SIDE_GROUP
    if _SIDE_GROUP is None and dist.is_initialized():
        _SIDE_GROUP = dist.new_group(backend="gloo")
    return _SIDE_GROUP


def shutdown_world() -> None:
    """Tear down the process group (callers must drop DDP/FSDP wrappers first)."""
    global _SIDE_GROUP
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            _SIDE_GROUP = None
            dist.destroy_process_group()


def launched_pid() -> int:
    """The pid torchrun started for this rank: the warm spare's client when the spare forked it, else our own."""
    return _env_int(MUSUBI_CLIENT_PID, os.getpid())


def attempt_id() -> str:
    """This attempt: launch number (job.json attempts) and torchrun restart, e.g. '1.2'."""
    return f"{os.environ.get('MUSUBI_LAUNCH', '1')}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
