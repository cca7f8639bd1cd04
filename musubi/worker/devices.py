"""Runtime binding check: every rank reports its GPU (host + UUID) and the job stops if two share one.

Preflight reads CUDA_VISIBLE_DEVICES before launch; this catches what only
the ranks can see (a wrapper script that overrides the variable per rank, a
scheduler that hands two tasks the same GPU). It is one all-gather at start,
run by every rank, so every rank reaches the same verdict and raises together.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from musubi.contract.errors import ConfigError
from musubi.contract.world import World


@dataclass(frozen=True)
class DeviceIdentity:
    """Which physical GPU a rank drives."""

    rank: int
    host: str
    uuid: str
    name: str = ""
    device: str = ""  # e.g. 'cuda:0' (the rank's local index)


def device_identity(rank: int, device: torch.device) -> DeviceIdentity:
    """This rank's GPU as CUDA reports it (UUID from the device properties, NVML-style 'GPU-...')."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "")
    if not uuid:  # builds without the uuid property: the PCI address is as unique on one host
        uuid = "pci:" + ":".join(str(getattr(props, f, "?")) for f in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    elif not uuid.startswith("GPU-"):
        uuid = f"GPU-{uuid}"
    return DeviceIdentity(rank=rank, host=socket.gethostname(), uuid=uuid, name=props.name, device=f"cuda:{index}")


def gather_identities(own: DeviceIdentity) -> list[DeviceIdentity]:
    """Every rank's identity, in rank order (a collective: all ranks must call it)."""
    out: list[DeviceIdentity | None] = [None] * dist.get_world_size()
    dist.all_gather_object(out, own)
    return [i for i in out if i is not None]


def shared_device_error(identities: list[DeviceIdentity]) -> str | None:
    """The one-line error for the first GPU driven by two ranks, or None when every rank has its own."""
    first: dict[tuple[str, str], DeviceIdentity] = {}
    for ident in sorted(identities, key=lambda i: i.rank):
        key = (ident.host, ident.uuid)
        if key in first:
            a = first[key]
            return (f"ranks {a.rank} and {ident.rank} share one GPU ({ident.name or 'GPU'} {ident.uuid} on "
                    f"{ident.host}, as {a.device} and {ident.device}); give each rank its own GPU: check "
                    "CUDA_VISIBLE_DEVICES (do not override it per rank) and --nproc")
        first[key] = ident
    return None


def check_unique_devices(world: World, identity: DeviceIdentity | None = None) -> None:
    """Abort (ConfigError on every rank) if two ranks drive the same GPU; a no-op on CPU ranks.

    `identity` is this rank's reading (default: read from `world.device`); passing one lets CPU
    ranks run the real collective in tests.
    """
    # Every branch depends only on what all ranks share (size, device kind), so all ranks take it together.
    if world.size < 2 or not dist.is_initialized():
        return
    if identity is None:
        if not world.is_cuda:
            return
        identity = device_identity(world.rank, world.device)
    message = shared_device_error(gather_identities(identity))
    if message is not None:
        raise ConfigError(message)
