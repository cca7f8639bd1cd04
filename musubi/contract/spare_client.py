"""The thin client that has the warm spare fork a rank or torchrun's agent, and the wire both ends speak.

torchrun starts `python -I -S .../spare_client.py SPARE_DIR READY_S musubi.worker.worker -- JOB_DIR [flags]`
(`--no-python`) in place of `python -m musubi.worker.worker JOB_DIR [flags]`, and the launcher starts torchrun's
agent as `... spare_client.py SPARE_DIR READY_S musubi.contract.rendezvous -- [torchrun's arguments]` in place
of `python -m musubi.contract.rendezvous ...`. This file is the whole client and imports the standard library
only (run isolated, without site: it starts in a few tens of ms), so neither the agent nor a rank pays the
interpreter's imports of torch and Musubi: the warm spare of its launch (musubi/worker/spare.py) paid them
once and forks the process from itself (the spare serves only the entries it was started with). The client:

- connects to the spare's socket in SPARE_DIR (waiting up to READY_S seconds while the spare imports), sends
  its argv, working directory, environment, CPU affinity and its fds 0/1/2, and gets back the rank's pid;
- forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the process (torchrun signals a rank's
  client, the launcher or a terminal the agent's);
- ends exactly as the process did: the same exit code, or killed by the same signal, so torchrun's restarts,
  its error files (TORCHELASTIC_ERROR_FILE rides in the environment), the launcher's reading of torchrun's
  end and the exit-code table (contract/exits.py) see no difference;
- falls back, when the spare refused, is gone, is not ready in time or never ran, to exec'ing the plain
  `python -m MODULE ...` (the path without a spare; the module is the client's third argument), saying why
  once an attempt (the agent, rank 0) on stderr, which is the job's torchrun log.

If the client is SIGKILLed, the spare sees its connection close and SIGKILLs the process. If the spare dies, the process dies
with it and the client exits EXIT_SPARE_GONE (79): the launcher relaunches without a spare.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import struct
import sys
import time
from typing import Any, NoReturn

#: The socket the spare listens on, inside its 0700 folder (a short path: AF_UNIX paths hold ~107 bytes).
SOCKET_NAME = "spare.sock"
#: The launcher writes the spare's pid here as it starts it: a client waiting for the socket knows a spare that died.
PID_NAME = "spare.pid"
#: The spare writes why it will not serve here (its imports failed, threads alive): the clients fall back.
REFUSED_NAME = "refused.txt"
#: The spare's output until the launcher names the job's log (the job's folder does not exist when it starts).
LOG_NAME = "spare.log"
#: The launcher writes the job's log path here once the job's folder exists; the spare then writes there.
LOG_PATH_NAME = "log-path"
#: Signals torchrun (or a user) sends a rank, forwarded to the rank the spare forked.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: A wait between looks for the socket while the spare still imports (s).
POLL_S = 0.02
_HEAD = struct.Struct("!I")  # the byte length of the JSON body that follows


def exits() -> Any:
    """musubi/contract/exits.py (the one exit-code table), loaded by path on the rare ends that need a code of
    their own: this file runs isolated (`-I -S`), with no package to import it from, and a rank's usual end
    passes its own code through."""
    mod = sys.modules.get("musubi_contract_exits")
    if mod is None:
        spec = importlib.util.spec_from_file_location("musubi_contract_exits",
                                                      os.path.join(os.path.dirname(__file__), "exits.py"))
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = mod  # type: ignore[union-attr]  # dataclasses looks its module up by name
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


class Unavailable(Exception):
    """The spare cannot serve this rank; the message says why (the client then starts the plain way)."""


def send_message(sock: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    """One message: a 4-byte length, then JSON; `fds` travel with the length (SCM_RIGHTS)."""
    body = json.dumps(obj).encode()
    head = _HEAD.pack(len(body))
    if fds:
        socket.send_fds(sock, [head], fds)
        sock.sendall(body)
    else:
        sock.sendall(head + body)


def receive_message(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """The next message and the fds sent with it; (None, []) when the peer closed the connection first."""
    fds: list[int] = []
    head = b""
    while len(head) < _HEAD.size:
        if max_fds and not head:
            chunk, got, _, _ = socket.recv_fds(sock, _HEAD.size, max_fds)
            fds += got
        else:
            chunk = sock.recv(_HEAD.size - len(head))
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        head += chunk
    (size,) = _HEAD.unpack(head)
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(min(1 << 16, size - len(body)))
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        body += chunk
    return json.loads(body), fds


def process_created() -> float:
    """Wall-clock time this process was created, to a clock tick (10 ms). Its start in /proc counts ticks since
    boot; measured back from now on the boot clock, not added to /proc/stat's btime as psutil's create_time() does:
    btime is whole seconds, so that sum is up to 1 s early (a rank forked in 0.1 s then seemed to start before the
    launcher that asked for it)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, clock ticks since boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(0.0, age)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def connect(spare_dir: str, ready_s: float) -> socket.socket:
    """A connection to the spare once it listens; Unavailable if it refused, died or is not ready in time."""
    path = os.path.join(spare_dir, SOCKET_NAME)
    deadline = time.monotonic() + ready_s
    while True:
        refused = os.path.join(spare_dir, REFUSED_NAME)
        if os.path.exists(refused):
            with open(refused, encoding="utf-8", errors="replace") as f:
                raise Unavailable(f.read().strip() or "the warm spare refused")
        if os.path.exists(path):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                return sock
            except OSError as e:  # the socket is there but nobody listens: the spare stopped
                sock.close()
                raise Unavailable(f"the warm spare does not answer on {path} ({e.strerror})") from None
        if not os.path.isdir(spare_dir):
            raise Unavailable(f"the warm spare's folder {spare_dir} is gone")
        pid = _spare_pid(spare_dir)
        if pid is not None and not process_alive(pid):
            raise Unavailable(f"the warm spare (pid {pid}) ended before it was ready")
        if time.monotonic() >= deadline:
            raise Unavailable(f"the warm spare was not ready within {ready_s:g} s")
        time.sleep(POLL_S)


def _spare_pid(spare_dir: str) -> int | None:
    try:
        with open(os.path.join(spare_dir, PID_NAME), encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def process_alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (ended, not yet reaped by the launcher) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


class Forwarder:
    """Signal handlers that pass each forwarded signal on to the rank (kept while its pid is not known yet). A
    signal this process started with ignored stays ignored and is not forwarded: under `nohup` (SIGHUP) or as a
    shell's background job (SIGINT, SIGQUIT) a rank started the plain way would ignore it too."""

    def __init__(self, ignored: list[int]) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []
        self.forwarded = [sig for sig in FORWARDED if int(sig) not in ignored]
        for sig in self.forwarded:
            signal.signal(sig, self.handle)

    def handle(self, signum: int, frame: object) -> None:  # noqa: ARG002
        """Forward `signum` to the rank, or keep it until the rank's pid is known."""
        if self.pid is None:
            self.pending.append(signum)
            return
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def attach(self, pid: int) -> None:
        """The rank is `pid`: deliver what arrived before it was known."""
        self.pid = pid
        for sig in self.pending:
            self.handle(sig, None)
        self.pending.clear()

    def restore(self) -> None:
        """Default handlers back (before an exec or a death by signal); a signal kept is delivered to ourselves."""
        for sig in self.forwarded:
            signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
        for sig in self.pending:
            die_by(sig)


def die_by(sig: int) -> NoReturn:
    """End this process by `sig` with its default action, as the rank ended."""
    if sig != signal.SIGKILL:
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(1.0)  # a stopping signal may be delivered late: never fall through to exit 0
    os._exit(exits().after_signal(sig))


def fall_back(module: str, args: list[str], why: str, forwarder: Forwarder | None = None) -> NoReturn:
    """Start the process the plain way (exec of `python -m MODULE ARGS`), saying why once per attempt (the agent,
    rank 0)."""
    if os.environ.get("RANK", "0") == "0":  # one line an attempt, not one a rank (the agent has no RANK)
        sys.stderr.write(f"musubi: warm spare not used ({why}); {module} starts in a fresh interpreter\n")
        sys.stderr.flush()
    if forwarder is not None:
        forwarder.restore()
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


def request(module: str, args: list[str], started: float, ignored: list[int] | None = None) -> dict:
    """What the spare needs to become this rank: its module, argv, working directory, environment, process state
    (`ignored`: the signals this client started with ignored, see ignored_signals; by default those ignored now)."""
    return {"module": module, "argv": args, "cwd": os.getcwd(), "env": dict(os.environ), "started": started,
            "affinity": sorted(os.sched_getaffinity(0)), "umask": _umask(),
            "ignored": ignored_signals() if ignored is None else ignored}


def ignored_signals() -> list[int]:
    """The signals ignored as this interpreter started: inherited through exec (nohup's SIGHUP, a background job's
    SIGINT and SIGQUIT) and Python's own (SIGPIPE, SIGXFSZ). A process the spare forks ignores the same, as a
    process started the plain way by our parent would."""
    out = []
    for sig in signal.valid_signals():
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                out.append(int(sig))
        except (OSError, ValueError):  # a signal Python cannot query
            continue
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def run(argv: list[str]) -> int:
    """`SPARE_DIR READY_S MODULE -- ARGS...`: `MODULE.main(ARGS)` as a rank forked by the spare; returns (or
    dies) as the rank did."""
    started = process_created()
    if len(argv) < 4 or argv[3] != "--":
        sys.stderr.write("usage: spare_client.py SPARE_DIR READY_S MODULE -- [the module's arguments]\n")
        return exits().EXIT_CONFIG
    spare_dir, module, args = argv[0], argv[2], argv[4:]
    ignored = ignored_signals()  # before the forwarder's handlers replace any
    forwarder = Forwarder(ignored)
    try:
        sock = connect(spare_dir, float(argv[1]))
    except (Unavailable, ValueError) as e:
        fall_back(module, args, str(e), forwarder)
    try:
        send_message(sock, request(module, args, started, ignored), [0, 1, 2])
        reply, _ = receive_message(sock)
    except OSError as e:
        fall_back(module, args, f"the warm spare's connection failed ({e})", forwarder)
    if reply is None or "pid" not in reply:
        fall_back(module, args, (reply or {}).get("refused", "the warm spare closed the connection"), forwarder)
    forwarder.attach(int(reply["pid"]))
    try:
        end, _ = receive_message(sock)
    except OSError:
        end = None
    if end is None or "status" not in end:  # the spare died: its children die with it (PR_SET_PDEATHSIG)
        sys.stderr.write(f"musubi: the warm spare ended before {module} pid {reply['pid']}; it was killed\n")
        return exits().EXIT_SPARE_GONE  # the launcher tells the spare's death from the process's own failure
    status = int(end["status"])
    if os.WIFSIGNALED(status):
        die_by(os.WTERMSIG(status))
    return os.waitstatus_to_exitcode(status) if not os.WIFEXITED(status) else os.WEXITSTATUS(status)


if __name__ == "__main__":
    code = run(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
