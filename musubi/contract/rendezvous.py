"""torchrun with its rendezvous bound to the address asked for, never to every interface.

`python -m musubi.contract.rendezvous ARGS` is `python -m torch.distributed.run ARGS`
with one difference. torch's TCPStore server (the c10d rendezvous store and the
workers' MASTER_ADDR store) listens on the wildcard address whatever host it is
given (pytorch/pytorch#173909): on a shared machine any user of the network
could talk to a single-node job's store. Here every store server is handed a
socket Musubi bound itself to the endpoint's own address (`--standalone` means
`localhost`, so 127.0.0.1; a multi-node `--rdzv-endpoint HOST:PORT` binds HOST's
address) through TCPStore's public `master_listen_fd` argument. The rendezvous
and the launcher stay torch's; only the listening socket is chosen by us.

The workers' own sockets (gloo pairs, NCCL bootstrap) follow
`GLOO_SOCKET_IFNAME` / `NCCL_SOCKET_IFNAME`: `single_node_env` points them at
the loopback interface unless the user set them.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Mapping
from typing import Any

#: Wildcard addresses: a rendezvous never listens on every interface.
_WILDCARDS = {"0.0.0.0", "::", ""}


def bind_address(host: str) -> tuple[int, str]:
    """(address family, numeric address) the store of `host` listens on; ValueError for a wildcard."""
    if host.strip("[]") in _WILDCARDS:
        raise ValueError(f"rendezvous host {host!r} means every interface; give the address of one interface")
    if host == "localhost":
        return socket.AF_INET, "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
        return (socket.AF_INET6 if ip.version == 6 else socket.AF_INET), str(ip)
    except ValueError:
        pass
    family, _, _, _, addr = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0]
    return family, addr[0]


def listening_socket(host: str, port: int) -> tuple[int, int]:
    """(fd, port) of a socket bound to `host`'s address and listening (port 0: a free port)."""
    family, addr = bind_address(host)
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        s.listen(512)
        real_port = s.getsockname()[1]
    except OSError:
        s.close()
        raise
    return s.detach(), real_port


def bound_store_class() -> type:
    """A TCPStore whose server listens only on its host's address (clients are unchanged)."""
    import torch.distributed as dist

    real = dist.TCPStore
    if getattr(real, "_musubi_bound", False):
        return real

    class BoundTCPStore(real):  # type: ignore[misc, valid-type]
        _musubi_bound = True

        def __init__(self, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                     *args: Any, **kwargs: Any) -> None:
            if is_master and kwargs.get("master_listen_fd") is None and len(args) < 4:
                fd, port = listening_socket(host_name, port)
                kwargs["master_listen_fd"] = fd
            super().__init__(host_name, port, world_size, is_master, *args, **kwargs)

    return BoundTCPStore


def install() -> None:
    """Make every TCPStore torchrun creates in this process a bound one."""
    import torch.distributed as dist
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d_backend

    store = bound_store_class()
    dist.TCPStore = store  # dynamic_rendezvous and elastic.utils.distributed look it up here
    c10d_backend.TCPStore = store  # imported by name at module load


def loopback_interface() -> str | None:
    """The name of the interface holding 127.0.0.1 (`lo` on Linux), or None."""
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addrs):
                return name
    except (ImportError, OSError):
        pass
    return None


def single_node_env(env: Mapping[str, str]) -> dict[str, str]:
    """Variables that keep a single-node job's worker sockets on loopback (only those the user left unset)."""
    lo = loopback_interface()
    if lo is None:
        return {}
    return {k: lo for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k not in env}


def torchrun_module() -> list[str]:
    """`-m module` of the launcher to start: torchrun behind the bound rendezvous."""
    return ["-m", "musubi.contract.rendezvous"]


def main(argv: list[str] | None = None, started: float | None = None) -> int:  # noqa: ARG001
    """Run torchrun with bound stores. `started` is the warm spare's entry contract (worker/spare.py forks this
    agent and hands every entry its start time); the agent has no use for it."""
    import gc

    # Importing torch.distributed.run (all of torch) creates objects that live on: collections meanwhile free
    # nothing, and later ones need not walk them (frozen). With the collector off during the import the agent
    # spends less CPU (figures: docs/benchmarks-history.md, the agent's import); the freeze was not timed apart.
    # Ranks do the same (worker.main).
    gc.disable()
    try:
        install()
        from torch.distributed.run import main as torchrun_main

        gc.freeze()  # torch's modules live as long as the agent: its later collections need not walk them
    finally:
        gc.enable()

    torchrun_main(argv if argv is not None else sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
