"""Multi-node jobs: torchrun's c10d rendezvous, the interface it binds to, and its failures in one line.

A job on M nodes runs one torchrun agent per node (`musubi train --nnodes M
--node-rank R --rdzv-endpoint HOST:PORT`). The agents meet at a c10d store that
the first node (node rank 0) hosts at HOST:PORT; torchrun lays ranks out node by
node (global rank = node's group rank x ranks per node + local rank), so the
chattiest groups of a job stay inside a node. Musubi writes no rendezvous of its
own: it only picks the arguments, the interface, and bounds the waiting; the store
itself listens on the endpoint's address only (contract/rendezvous.py).

Interface: the agents and the gloo/NCCL sockets use the interface asked for
(`--iface`), else the one this node routes to the endpoint through; never
0.0.0.0 nor the FQDN (which Debian maps to 127.0.1.1). A single-node job keeps
torchrun's `--standalone` rendezvous on loopback.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from musubi.contract.errors import ConfigError

#: Default port of the rendezvous store on the first node (torchrun's own default).
DEFAULT_PORT = 29400
#: How long an agent waits for all nodes to join (and for the store to answer), in seconds.
DEFAULT_JOIN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Rendezvous:
    """Where and how the agents of one multi-node job meet."""

    nnodes: int
    node_rank: int
    host: str
    port: int
    rdzv_id: str
    join_timeout_s: int = DEFAULT_JOIN_TIMEOUT_S
    local_addr: str = ""  # this node's address on the chosen interface
    iface: str = ""  # that interface's name (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)

    @property
    def endpoint(self) -> str:
        """HOST:PORT as torchrun takes it (IPv6 in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_first(self) -> bool:
        """True on node rank 0: it hosts the store and writes the job's records."""
        return self.node_rank == 0

    def torchrun_args(self) -> list[str]:
        """torchrun's multi-node arguments (instead of --standalone --nnodes=1)."""
        # is_host is explicit: on one machine (tests) or where names resolve oddly, torch's guess
        # "the endpoint is my hostname" would let a second node start a store of its own and wait alone.
        conf = (f"join_timeout={self.join_timeout_s},read_timeout={self.join_timeout_s},"
                f"is_host={'true' if self.is_first else 'false'}")
        return [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id={self.rdzv_id}", f"--rdzv-conf={conf}",
                f"--local-addr={self.local_addr}"]

    def socket_env(self, user_env: Mapping[str, str]) -> dict[str, str]:
        """GLOO/NCCL socket interfaces for the workers (the user's own settings win)."""
        out: dict[str, str] = {}
        if self.iface:
            for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                if name not in user_env:
                    out[name] = self.iface
        return out


def parse_endpoint(text: str) -> tuple[str, int]:
    """'HOST:PORT', 'HOST' (port 29400) or '[v6]:PORT' -> (host, port); refuses wildcard and empty hosts."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?|([^:\s\[\]]+)(?::(\d+))?", text.strip())
    if not m:
        raise ConfigError(f"--rdzv-endpoint {text!r}: give HOST:PORT of the first node (e.g. node001:29400)")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4) or DEFAULT_PORT)
    if not 1 <= port <= 65535:
        raise ConfigError(f"--rdzv-endpoint {text!r}: port {port} is out of range 1-65535")
    try:
        wildcard = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        wildcard = False  # a host name
    if wildcard:
        raise ConfigError(f"--rdzv-endpoint {text!r}: {host} is no address another node can reach; give the "
                          "first node's address on the network the nodes share")
    return host, port


def interface_of(ip: str) -> str | None:
    """The name of the interface that holds `ip` (None when none does)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == ip for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)):
            return name
    return None


def address_of(iface: str) -> str:
    """The IPv4 (else IPv6) address of an interface; ConfigError naming the interfaces there are."""
    import psutil

    addrs = psutil.net_if_addrs()
    if iface not in addrs:
        raise ConfigError(f"--iface {iface}: no such interface here; choose one of {', '.join(sorted(addrs))}")
    for family in (socket.AF_INET, socket.AF_INET6):
        for a in addrs[iface]:
            if a.family == family:
                return a.address.split("%")[0]
    raise ConfigError(f"--iface {iface}: the interface has no IP address; choose another")


def route_to(host: str, port: int) -> str:
    """This node's source address towards host:port (a UDP connect sends nothing, it asks the routing table)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as e:
        raise ConfigError(f"--rdzv-endpoint {host}:{port}: cannot resolve {host!r} ({e.strerror}); give the first "
                          "node's address or a name every node resolves") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(addr)
        except OSError as e:
            raise ConfigError(f"--rdzv-endpoint {host}:{port}: no route to it from here ({e.strerror}); check the "
                              "address or give --iface") from None
        return s.getsockname()[0]


def default_rdzv_id(out: Path, job_name: str) -> str:
    """One id per job and run directory, the same on every node (the run directory is shared)."""
    digest = hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:10]
    return f"{job_name}-{digest}"


def make_rendezvous(nnodes: int, node_rank: int, endpoint: str | None, out: Path | None, job_name: str,
                    rdzv_id: str | None = None, iface: str | None = None,
                    join_timeout_s: int = DEFAULT_JOIN_TIMEOUT_S) -> Rendezvous | None:
    """Validate the multi-node options of `musubi train`; None for a single-node job."""
    if nnodes < 1:
        raise ConfigError(f"--nnodes {nnodes}: must be >= 1")
    if nnodes == 1:
        if node_rank or endpoint:
            raise ConfigError("--node-rank/--rdzv-endpoint need --nnodes 2 or more; drop them for one node")
        return None
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank {node_rank}: must be 0..{nnodes - 1} for --nnodes {nnodes}")
    if not endpoint:
        raise ConfigError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the first node's address, the same "
                          "on every node)")
    if out is None:
        raise ConfigError(f"--nnodes {nnodes} needs --out RUN_DIR on storage every node shares (the same path "
                          "on every node)")
    if join_timeout_s < 1:
        raise ConfigError(f"--rdzv-timeout {join_timeout_s}: must be >= 1 second")
    host, port = parse_endpoint(endpoint)
    if iface:
        local = address_of(iface)
    else:
        local = route_to(host, port)
        iface = interface_of(local) or ""
    return Rendezvous(nnodes, node_rank, host, port, rdzv_id or default_rdzv_id(out, job_name), join_timeout_s,
                      local, iface)


#: torchrun's rendezvous errors as they appear in its log, and what they mean for the user.
_FAILURES = (
    ("RendezvousTimeoutError", "not all {n} nodes joined rendezvous {id} at {ep} within {t}s; start `musubi train "
     "--nnodes {n}` with the same --rdzv-endpoint on every node (node ranks 0..{last})"),
    ("RendezvousConnectionError", "node {r} could not reach the rendezvous at {ep} within {t}s; check "
     "--rdzv-endpoint (the first node's address and port) and that node 0 is started"),
    ("DistNetworkError", "node {r} could not reach the rendezvous at {ep} within {t}s; check --rdzv-endpoint "
     "(the first node's address and port) and that node 0 is started"),
    ("RendezvousClosedError", "rendezvous {id} at {ep} is closed (the job already ended on another node); start "
     "every node again with a new --rdzv-id"),
)


def rendezvous_error(rdzv: Rendezvous, torchrun_log: Path) -> str | None:
    """One line for a rendezvous failure found in torchrun's log (None when it was something else)."""
    try:
        text = torchrun_log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for marker, template in _FAILURES:
        if marker in text:
            return "rendezvous failed: " + template.format(n=rdzv.nnodes, last=rdzv.nnodes - 1, id=rdzv.rdzv_id,
                                                          ep=rdzv.endpoint, t=rdzv.join_timeout_s,
                                                          r=rdzv.node_rank)
    return None
