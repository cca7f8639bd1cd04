"""A spare server (zygote): one long-lived process that has imported what every launch's warm spare imports, and
forks a launch's spare on request.

`python -m musubi.worker.spare_server SERVER_DIR` imports torch, torch.distributed, its checkpoint
package, torch._dynamo, torchrun and Musubi's rank, agent and task-check modules once (no CUDA call), and then
serves `musubi.worker.spare` through the warm spare's own loop and wire (worker/spare.py, contract/spare_client.py):
a launcher that finds MUSUBI_SPARE_SERVER=SERVER_DIR in its environment sends the spare's command line, its
environment, working folder, umask, CPU affinity, ignored signals and fds 0/1/2, and gets the spare's pid, then its
wait status when it ends (launch/spare.py `ServedProcess`). The forked spare becomes what `python -m
musubi.worker.spare` started by the launcher would be: the launch's environment (replaced before anything reads it),
torch's intra-op threads from its OMP_NUM_THREADS, sys.path from its folder and PYTHONPATH, the signals a new
interpreter would have, a session of its own, no fd of the server's. It then imports only the job's task module.
So a launch's spare costs a fork (copy-on-write) instead of an interpreter that imports torch (3-6 s of CPU).

The spare dies with the server (PR_SET_PDEATHSIG) and the server kills it when the launcher's connection closes (the
launcher died), so it still dies with the launcher; the server dies with its parent. A server
that is gone, refused or not ready within SERVER_READY_S leaves the launcher to start its spare the plain way.
`tests/conftest.py` starts one per pytest process; a fleet or a dev box may start one the same way.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from musubi.contract.spare_client import PID_NAME, REFUSED_NAME, SOCKET_NAME
from musubi.worker import spare

#: What the server imports: a spare's (the rank's modules, torchrun) and the launcher's entries a spare serves.
SERVER_MODULES = (*spare.RANK_MODULES, *spare.AGENT_MODULES, spare.WORKER_ENTRY, spare.AGENT_ENTRY,
                  "musubi.launch.task_checks")


#: Set in every launch's environment (launch.py): read as the interpreter starts, so the server starts with it.
UNBUFFERED = "PYTHONUNBUFFERED"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The server's command line."""
    ap = argparse.ArgumentParser(prog="musubi-spare-server")
    ap.add_argument("server_dir", type=Path, help="its folder (made 0700): the socket, its pid, its log, a refusal")
    return ap.parse_args(argv)


def prepare(folder: Path) -> None:
    """The server's 0700 folder with this process's pid, and nothing left of an earlier server in it."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    for name in (REFUSED_NAME, SOCKET_NAME):  # a refusal or socket of a server before must not answer for this one
        (folder / name).unlink(missing_ok=True)
    (folder / PID_NAME).write_text(f"{os.getpid()}\n", encoding="ascii")


def main(argv: list[str] | None = None) -> int:
    """`SERVER_DIR`: warm up, then fork launches' spares until stopped (SIGTERM)."""
    args = parse_args(argv)
    if os.environ.get(UNBUFFERED) != "1":  # a launch's spare runs unbuffered (launch.py): so must the server
        os.execve(sys.executable, [sys.executable, "-m", "musubi.worker.spare_server", *sys.argv[1:]],
                  {**os.environ, UNBUFFERED: "1"})
    prepare(args.server_dir)
    return spare.main([str(args.server_dir), str(args.server_dir), str(os.getppid()), "--server",
                       f"--entry={spare.SPARE_ENTRY}", "--warm", ",".join(SERVER_MODULES)])


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown of torch's modules
