"""Host copies of a checkpoint's state, kept across saves: what an asynchronous save waits for.

DCP's `DefaultStager` caches its host buffers inside a `StateDictStager` keyed by the source
storages, but torch 2.11 closes that cache after every staging, so each save allocated (and, on
GPU, pinned or shared) the whole state again, blocking the step for over half as long as a
synchronous save of it (BENCHMARKS.md, checkpoint). `HostStager` keeps one buffer per state-dict
entry for the life of the Checkpointer through DCP's public `AsyncStager` protocol, whatever the
torch version does with its own stager; a save then costs one device-to-host copy.

Reusing a buffer is safe because the Checkpointer keeps at most one save in flight: the next save
starts only after the previous one's shards are durable (`Checkpointer.wait`).

Sharded state (FSDP2's DTensors) keeps DCP's own stager, a fresh one per save: a DTensor's
placement must travel with its host copy, which DCP's deep copy handles.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.distributed.checkpoint.staging import AsyncStager

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch without the public DTensor module
    DTensor = ()  # type: ignore[assignment,misc]


def holds_dtensor(state: Any) -> bool:
    """True when any leaf of a nested state dict is a DTensor (sharded state)."""
    if isinstance(state, DTensor):
        return True
    if isinstance(state, dict):
        return any(holds_dtensor(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return any(holds_dtensor(v) for v in state)
    return False


class HostStager(AsyncStager):
    """DCP stager whose host buffers (pinned on GPU, shared for the checkpoint process) outlive a save."""

    _synchronize_after_execute = False  # stage() returns only once the copies have landed

    def __init__(self, pin: bool, share: bool) -> None:
        self.pin = pin and torch.cuda.is_available()
        self.share = share
        self._buffers: dict[str, torch.Tensor] = {}
        self._registered: list[int] = []  # data pointers pinned with cudaHostRegister (shared + pinned)
        self.allocated_bytes = 0

    @torch.no_grad()
    def stage(self, state_dict: Any) -> Any:
        """A host copy of `state_dict`: tensors into the kept buffers, everything else deep-copied."""
        out = self._copy(state_dict, "")
        if self.pin:  # non-blocking device-to-host copies: wait for them before the writer reads
            torch.cuda.current_stream().synchronize()
        return out

    def _copy(self, obj: Any, key: str) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._stage_tensor(obj, key)
        if isinstance(obj, dict):
            return {k: self._copy(v, f"{key}/{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self._copy(v, f"{key}/{i}") for i, v in enumerate(obj)]
            return type(obj)(items) if isinstance(obj, list) else tuple(items)
        return copy.deepcopy(obj)

    def _stage_tensor(self, t: torch.Tensor, key: str) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = self._allocate(t)
            self._buffers[key] = buf
        buf.copy_(t.detach(), non_blocking=self.pin and t.is_cuda)
        return buf

    def _allocate(self, t: torch.Tensor) -> torch.Tensor:
        nbytes = t.numel() * t.element_size()
        self.allocated_bytes += nbytes
        if self.share:
            buf = torch.empty(t.shape, dtype=t.dtype).share_memory_()
            if self.pin and nbytes > 0:  # shared memory can be pinned in place (as DCP's stager does)
                rc = int(torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), nbytes, 1))
                if rc == 0:
                    self._registered.append(buf.data_ptr())
            return buf
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pin)

    def synchronize_staging(self) -> None:
        """Nothing left to wait for: `stage` returns after its copies."""

    def close(self) -> None:
        """Unpin and drop the buffers (the Checkpointer's end)."""
        for ptr in self._registered:
            torch.cuda.cudart().cudaHostUnregister(ptr)
        self._registered.clear()
        self._buffers.clear()
