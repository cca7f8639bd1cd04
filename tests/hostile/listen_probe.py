"""Rank program for the rendezvous test: rank 0 writes every listening socket of the job's processes.

`python -m musubi.contract.rendezvous --standalone ... -m tests.hostile.listen_probe OUT.json`
"""

from __future__ import annotations

import json
import os
import sys

import psutil
import torch.distributed as dist


def main() -> None:
    """Join a gloo group, then (rank 0) list the LISTEN sockets of torchrun and every rank."""
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 0:
        agent = psutil.Process(os.getppid())
        pids = {agent.pid, *(c.pid for c in agent.children(recursive=True))}
        listening = [{"pid": c.pid, "ip": c.laddr.ip, "port": c.laddr.port}
                     for c in psutil.net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN and c.pid in pids]
        with open(sys.argv[1], "w", encoding="utf-8") as f:
            json.dump({"listening": listening, "pids": sorted(pids),
                       "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
