"""The launcher's side of the warm spare: start it, start torchrun's agent through its client, point torchrun
at its client, stop it.

A new rank used to be a new interpreter that imported torch, DCP, torch._dynamo and Musubi's rank modules:
seconds per rank and per restart (the 2x H200 soak: entry and imports ~9 s of a ~13 s restart). Now the
launcher starts one warm spare per node and launch (`python -m musubi.worker.spare`, named as a string: the
launcher never imports the rank's side) that imports them once, and torchrun starts a thin client
(contract/spare_client.py) per rank that has the spare fork the rank. torchrun's agent, which imported all of
torch too, is started the same way: the launcher runs the client with the agent's entry, and the spare forks
the agent. The agent and the ranks are the spare's children: stop_trees is handed the spare beside the
agent's client, the spare SIGKILLs a child whose client is gone, and its children die with it (and it with
the launcher). A spare that dies under the agent takes it along: the agent's client exits EXIT_SPARE_GONE,
`died` says how the spare ended, and the launcher relaunches once without a spare (launch.without_spare). Off
with `train.warm_spare: false` or MUSUBI_WARM_SPARE=0; a client that finds no ready spare starts its process the
plain way.

The spare starts as soon as the launch's cheap checks passed, before the job's folder exists (nothing is written
there before a refusal): it reads the job's config from its own folder and writes its output there until `name_log`
names the job's log. Meanwhile its imports overlap the launcher's other work, and the launcher has it fork a child
for the checks that need torch (`run_in_spare`, launch/task_checks.py), so the launcher never imports torch itself.

With MUSUBI_SPARE_SERVER naming a running spare server (worker/spare_server.py, a zygote that imported all of that
once), the launcher has the server fork its spare (`served`) instead of starting an interpreter: the same command
line, environment, folder, signals and fds, a `ServedProcess` in place of the Popen. A server gone, refused or not
ready within SERVER_READY_S: the spare starts the plain way.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from musubi.contract import spare_client
from musubi.contract.env import MUSUBI_SPARE_SERVER, MUSUBI_WARM_SPARE
from musubi.contract.exits import EXIT_SPARE_GONE
from musubi.contract.run_files import RUN_FILES

#: The module the spare runs (`python -m`): the rank's side, named, not imported.
SPARE_MODULE = "musubi.worker.spare"
#: The rank's entry (`python -m` without a spare; the spare calls its main()).
WORKER_MODULE = "musubi.worker.worker"
#: torchrun's agent behind the bound rendezvous (`python -m` without a spare; the spare calls its main()).
AGENT_MODULE = "musubi.contract.rendezvous"
#: The launch's checks that need torch (launch/task_checks.py): a child of the spare runs them for the launcher.
TASK_CHECKS_MODULE = "musubi.launch.task_checks"
#: What the launcher's spare may fork (its allowlist, on its command line).
ENTRIES = (WORKER_MODULE, AGENT_MODULE, TASK_CHECKS_MODULE)
#: Seconds a launcher waits for a spare server (MUSUBI_SPARE_SERVER) still importing before it starts its spare
#: the plain way: the server imports what the plain spare would, so waiting costs no more time and saves its CPU.
SERVER_READY_S = 60.0
#: Seconds a rank's client waits for the spare to finish its imports before it starts the plain way. The
#: spare starts before torchrun, which imports torch too, so a client rarely waits long; a waiting client
#: loses nothing against importing by itself, so the wait is generous.
READY_S = 60.0


class ServedProcess:
    """A spare a spare server forked (worker/spare_server.py): what the launcher uses of a Popen (pid, poll, wait,
    signals), its end read from the server's connection. Not the launcher's child: signals go through a pidfd (never
    to a pid reused after the server reaped it), and closing the connection has the server kill it."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock: socket.socket | None = sock
        self.pid = pid
        self.returncode: int | None = None
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except OSError:  # ended and reaped already: its status is on the connection
            self.pidfd = None

    def ended(self, timeout: float | None) -> bool:
        """Whether it has ended, waiting up to `timeout` s (None: forever) for the server's word."""
        if self.returncode is None and self.sock is not None:
            if select.select([self.sock], [], [], timeout)[0]:
                try:
                    end, _ = spare_client.receive_message(self.sock)
                except OSError:
                    end = None
                # No word: the server died, and the spare with it (PR_SET_PDEATHSIG, SIGKILL).
                self.returncode = (os.waitstatus_to_exitcode(int(end["status"])) if end and "status" in end
                                   else -signal.SIGKILL)
                self.close()
        return self.returncode is not None

    def poll(self) -> int | None:
        """Its exit code (negative: the signal), or None while it runs."""
        self.ended(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code once it ended; subprocess.TimeoutExpired after `timeout` s."""
        if not self.ended(timeout):
            raise subprocess.TimeoutExpired(SPARE_MODULE, timeout or 0.0)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        """Signal it unless it ended."""
        if self.pidfd is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, sig)

    def terminate(self) -> None:
        """SIGTERM (its stop: no more clients, SIGTERM to its children)."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL (its children die with it)."""
        self.send_signal(signal.SIGKILL)

    def close(self) -> None:
        """Drop the connection and the pidfd (the server kills a spare whose connection closed)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


@dataclass
class WarmSpare:
    """A started spare: its process and its 0700 folder (socket, pid, refusal, the job's config, its early output)."""

    proc: subprocess.Popen | ServedProcess
    folder: Path
    log: Path | None = None  # the job's log its output belongs in (name_log, once the job's folder exists)


def wanted(train: dict, env: dict[str, str]) -> bool:
    """Whether this launch starts a warm spare: the job's `train.warm_spare` and no MUSUBI_WARM_SPARE=0."""
    return bool(train.get("warm_spare", True)) and env.get(MUSUBI_WARM_SPARE, "1").strip() not in ("0", "false")


#: The longest socket path bind() takes (sun_path holds 108 bytes with its NUL) and the spare binds SOCKET + ".tmp".
MAX_SOCKET_PATH = 107


def socket_folder(env: dict[str, str]) -> Path:
    """A fresh 0700 folder whose socket path fits AF_UNIX: under the ranks' TMPDIR when it is short enough, else
    under /tmp or /dev/shm (a long TMPDIR, as a scheduler's per-job scratch or a test's, made bind() fail)."""
    longest = len("/musubi-spare-XXXXXXXX/") + len(spare_client.SOCKET_NAME) + len(".tmp")
    for base in (env.get("TMPDIR") or tempfile.gettempdir(), "/tmp", "/dev/shm"):
        if len(base) + longest <= MAX_SOCKET_PATH and os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            return Path(tempfile.mkdtemp(prefix="musubi-spare-", dir=base))
    raise OSError("no folder for the warm spare's socket: TMPDIR, /tmp and /dev/shm are too long or not writable")


def start_spare(config: dict, env: dict[str, str]) -> WarmSpare:
    """Start the spare for the job of `config` (its resolved config) with the ranks' environment as far as the checks
    know it (its imports read OMP_NUM_THREADS and the like; a rank follows its own thread count, worker/spare.py);
    its output goes to its own folder until name_log. It dies with this process (PR_SET_PDEATHSIG)."""
    folder = socket_folder(env)
    # The job's folder must not exist before the launch's checks passed: the spare reads the config from its own.
    (folder / RUN_FILES.job).write_text(json.dumps({"config": config}), encoding="utf-8")
    argv = [str(folder), str(folder), str(os.getpid()), *[f"--entry={m}" for m in ENTRIES]]
    server = env.get(MUSUBI_SPARE_SERVER, "").strip()
    proc = served(server, argv, env, folder / spare_client.LOG_NAME) if server else None
    if proc is None:
        with open(folder / spare_client.LOG_NAME, "a", encoding="utf-8") as log:
            # A session of its own: a Ctrl-C at the terminal is the launcher's to handle, not the spare's.
            proc = subprocess.Popen([sys.executable, "-m", SPARE_MODULE, *argv], env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log, start_new_session=True)
    # Written here, not by the spare: a client learns at once of a spare that died before it could write anything.
    (folder / spare_client.PID_NAME).write_text(f"{proc.pid}\n", encoding="ascii")
    return WarmSpare(proc, folder)


def served(server: str, argv: list[str], env: dict[str, str], log_path: Path,
           ready_s: float = SERVER_READY_S) -> ServedProcess | None:
    """The spare forked by the spare server in folder `server` for the command line `argv`, as `python -m` of it
    started here with `env` would be (the server's become: environment, folder, signals, session, fds 0/1/2 here
    /dev/null and the spare's log); None when the server is gone, refused or not ready in time, and the caller
    starts the spare itself."""
    try:
        sock = spare_client.connect(server, ready_s)
    except spare_client.Unavailable:
        return None
    # What a Popen child would have: this process's environment replaced by `env`, what it ignores (spare_client's
    # request: ignored now, which exec keeps), and this interpreter (the server refuses another one's).
    req = spare_client.request(SPARE_MODULE, [*argv, "--served"], time.time())
    req["env"] = dict(env)
    req["python"] = sys.executable
    try:
        with open(os.devnull, encoding="utf-8") as null, open(log_path, "a", encoding="utf-8") as log:
            spare_client.send_message(sock, req, [null.fileno(), log.fileno(), log.fileno()])
        reply, _ = spare_client.receive_message(sock)
    except OSError:
        reply = None
    if reply is None or "pid" not in reply:
        sock.close()
        with contextlib.suppress(OSError), open(log_path, "a", encoding="utf-8") as log:
            log.write(f"spare server {server} not used ({(reply or {}).get('refused', 'no answer')}); "
                      "the warm spare starts in a fresh interpreter\n")
        return None
    return ServedProcess(sock, int(reply["pid"]))


def name_log(spare: WarmSpare, log_path: Path) -> None:
    """Tell the spare the job's log (its folder exists now): the spare copies its output so far into it and writes
    there from its next turn or fork on; one it never took (it refused or died first) stop_spare copies there."""
    spare.log = log_path
    tmp = spare.folder / (spare_client.LOG_PATH_NAME + ".tmp")
    tmp.write_text(str(log_path.absolute()), encoding="utf-8")
    os.replace(tmp, spare.folder / spare_client.LOG_PATH_NAME)


def run_in_spare(spare: WarmSpare, module: str, args: list[str], ready_s: float = READY_S) -> int | None:
    """Have the spare fork `module`'s main(args) with this process's environment, working folder and stdout/stderr,
    and wait for it: its exit code, or None when the spare cannot (it refused, died or is not ready in time) and the
    caller does the work itself."""
    try:
        sock = spare_client.connect(str(spare.folder), ready_s)
    except spare_client.Unavailable:
        return None
    with sock, open(os.devnull, encoding="utf-8") as null:
        try:
            spare_client.send_message(sock, spare_client.request(module, args, time.time()), [null.fileno(), 1, 2])
            reply, _ = spare_client.receive_message(sock)
            if reply is None or "pid" not in reply:
                return None
            end, _ = spare_client.receive_message(sock)  # the child's wait status once it ended
        except OSError:
            return None
    if end is None or "status" not in end:  # the spare died, and its child with it
        return None
    return os.waitstatus_to_exitcode(int(end["status"]))


def client_command(spare: WarmSpare, ready_s: float = READY_S, module: str = WORKER_MODULE) -> list[str]:
    """What torchrun runs per rank instead of `-m musubi.worker.worker` (the worker's arguments follow)."""
    return ["--no-python", *client_argv(spare, ready_s, module)]


def agent_command(spare: WarmSpare, ready_s: float = READY_S) -> list[str]:
    """What the launcher runs instead of `python -m musubi.contract.rendezvous` (torchrun's arguments follow)."""
    return client_argv(spare, ready_s, AGENT_MODULE)


def client_argv(spare: WarmSpare, ready_s: float, module: str) -> list[str]:
    """The isolated client that has `spare` fork `module`'s process, before the module's own arguments."""
    return [sys.executable, "-I", "-S", spare_client.__file__, str(spare.folder), f"{ready_s:g}", module, "--"]


#: Seconds the launcher waits for a spare whose client said it ended (it exits first; its pid is reaped here).
DEATH_WAIT_S = 5.0


def died(spare: WarmSpare | None, agent_code: int) -> str | None:
    """How the spare died under torchrun's agent ('signal 9', 'exit code 1'), when the agent's client exited
    EXIT_SPARE_GONE (the spare, not the agent or a rank, ended the launch) and the spare ended unasked; else None."""
    if spare is None or agent_code != EXIT_SPARE_GONE:
        return None
    try:
        code = spare.proc.wait(timeout=DEATH_WAIT_S)
    except subprocess.TimeoutExpired:  # alive: the client lost its connection some other way
        return None
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def stop_spare(spare: WarmSpare, grace_s: float = 5.0) -> None:
    """End the spare (torchrun's agent has ended: its ranks have too, or get SIGTERM now), keep its output in the
    job's log when it never wrote there itself, and remove its folder."""
    if spare.proc.poll() is None:
        spare.proc.terminate()
        try:
            spare.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            spare.proc.kill()  # its ranks die with it (PR_SET_PDEATHSIG)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spare.proc.wait(timeout=5)
    if isinstance(spare.proc, ServedProcess):
        spare.proc.close()
    early = spare.folder / spare_client.LOG_NAME  # removed by the spare once it took the job's log
    if spare.log is not None and early.exists():
        with contextlib.suppress(OSError), open(spare.log, "a", encoding="utf-8") as log:
            log.write(early.read_text(encoding="utf-8", errors="replace"))
    shutil.rmtree(spare.folder, ignore_errors=True)
