"""Reading DCP checkpoints without unpickling arbitrary objects.

torch.distributed.checkpoint reads a checkpoint's `.metadata` with plain
`pickle.load`, and the non-tensor entries of a state dict (an optimizer's lr,
betas, ...) with `torch.load(weights_only=False)`: a checkpoint from someone
else could run code on load. Musubi loads every checkpoint through DCP's own
extension points instead, tightened:

- `SafeFileSystemReader` (a `FileSystemReader`) unpickles `.metadata` with an
  allow-list of the classes DCP writes (its metadata dataclasses, torch.Size,
  dtypes, layouts, paths) and refuses anything else; every shard it names must
  be a plain file name inside the checkpoint directory.
- `SafeLoadPlanner` / `SafeFullLoadPlanner` (DCP's default planners) load the
  non-tensor entries with `torch.load(weights_only=True)`.

Tensor shards are already read with `weights_only=True` by DCP itself.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from musubi.checkpoint.committed import outside_link as outside_link
from musubi.contract.errors import ConfigError
from musubi.tasks.weights import load_refusal

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
#: (module, name) pairs a DCP `.metadata` pickle may reference.
ALLOWED_GLOBALS = {
    *((_DCP_METADATA, n) for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                   "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                                   "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.planner", "LoadItemType"),
    ("torch.distributed.checkpoint.planner", "WriteItemType"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    """pickle with an allow-list of globals (the 'Restricting Globals' recipe of the pickle docs)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in checkpoint metadata")


def safe_unpickle(data: bytes) -> Any:
    """Unpickle DCP metadata bytes with the allow-list; UnpicklingError for anything else."""
    return _RestrictedUnpickler(io.BytesIO(data)).load()


class SafeFileSystemReader(FileSystemReader):
    """A FileSystemReader whose metadata is unpickled with an allow-list and whose shards stay in the directory.

    `refused` keeps the refusal's one line: torch 2.11's loader swallows the reader's exception and
    reports only "metadata is None" (seen on the GPU machine), so callers name the
    refusal from here (`refusal_or`).
    """

    refused: str | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """DCP's read_metadata, with the restricted unpickler and the shard names checked."""
        try:
            return self._read_metadata_safely(kwargs.get("rank"))
        except ConfigError as e:
            self.refused = str(e)
            raise

    def refusal_or(self, e: BaseException) -> str:
        """Why the load failed: this reader's refusal if it refused, else DCP's own first error."""
        return self.refused or describe_failure(e)

    def _read_metadata_safely(self, rank: Any) -> Any:
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        path = self._get_metadata_path(rank)
        with self.fs.create_stream(path, "rb") as f:
            raw = f.read()
        try:
            metadata = safe_unpickle(raw)
        except Exception as e:  # noqa: BLE001 - any failure of a hostile or damaged file is a refusal
            raise ConfigError(f"{self.path}: checkpoint metadata refused ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:160]}); load only checkpoints Musubi wrote") from None
        if not isinstance(metadata, Metadata):
            raise ConfigError(f"{self.path}: checkpoint metadata is not DCP metadata; load only checkpoints "
                              "Musubi wrote")
        for info in (metadata.storage_data or {}).values():
            rel = str(getattr(info, "relative_path", ""))
            if not rel or PurePosixPath(rel).name != rel or rel in {".", ".."} or "\\" in rel:
                raise ConfigError(f"{self.path}: checkpoint metadata names shard {rel!r} outside its directory; "
                                  "load only checkpoints Musubi wrote")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def describe_failure(e: BaseException) -> str:
    """One line for a DCP load failure: the first rank's own error (DCP wraps it in CheckpointException)."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        e = inner[0] if isinstance(inner, tuple) else inner
    text = " ".join(str(e).split())
    # A metadata read that failed: DCP reports both of its attempts; ours is the first.
    m = re.search(r"global metadata read failed: (.*?)(; rank local metadata read failed|$)", text)
    return (m.group(1) if m else text)[:300] or type(e).__name__


def _load_bytes_safely(value: io.BytesIO) -> Any:
    value.seek(0)
    try:
        return torch.load(value, weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"a checkpoint entry is not plain data: {load_refusal(e)}") from None


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner; non-tensor entries loaded with weights_only=True."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        """Like DefaultLoadPlanner.load_bytes, without unpickling arbitrary objects."""
        obj = _load_bytes_safely(value)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def full_state(ckpt_dir: Path, keys: frozenset[str] | None = None) -> dict[str, Any]:
    """Every entry of a DCP checkpoint (or only the top-level entries `keys`: an evaluation needs "model", not
    the optimizer's two moments) as one nested dict on the CPU, without a process group, read safely."""
    # What DCP's own dcp_to_torch_save does (same private helpers), with the safe reader and planner.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class _SafeFullLoadPlanner(_EmptyStateDictLoadPlanner):
        load_bytes = SafeLoadPlanner.load_bytes

    state: dict[str, Any] = {}
    reader = SafeFileSystemReader(str(ckpt_dir))
    try:
        planner = _SafeFullLoadPlanner(keys=None if keys is None else set(keys))
        _load_state_dict(state, storage_reader=reader, planner=planner, no_dist=True)
    except (Exception, CheckpointException):  # CheckpointException is a BaseException
        if reader.refused:
            raise ConfigError(reader.refused) from None
        raise
    return state
