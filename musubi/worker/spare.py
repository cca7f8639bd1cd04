"""A launch's warm spare: one process per node that imports torch once, then forks torchrun's agent and the ranks.

`python -m musubi.worker.spare SPARE_DIR JOB_DIR LAUNCHER_PID`, started by the launcher (launch/spare.py)
once the launch's cheap checks passed, before the job's folder exists: JOB_DIR holds the job's job.json (the
launcher's copy in SPARE_DIR), and its output goes to SPARE_DIR/spare.log until the launcher names the job's log
in SPARE_DIR/log-path. It imports torch, torch.distributed and its checkpoint package, torch._dynamo, torchrun
(torch.distributed.run), the rank's modules and the job's task module (no CUDA call, no parallel torch op),
freezes those objects out of the collector's reach, checks that no thread would outlive a fork, and listens on
`SPARE_DIR/spare.sock` (the folder is 0700, and a peer of another uid is refused by SO_PEERCRED). A thin client
(contract/spare_client.py) sends its entry module, argv, environment and fds 0/1/2; the spare forks a child that
becomes that entry's process, sends the client the child's pid, and its wait status when it ends. The launcher
starts torchrun's agent through such a client (entry `musubi.contract.rendezvous`), and the agent starts one
per rank (entry `musubi.worker.worker`); the launcher also has it fork the launch's checks that need torch
(entry `musubi.launch.task_checks`), so that the launcher never imports torch. Only the entries named on the
spare's command line are served (`--entry`, by default the rank's and the agent's: a client cannot have the spare
run any other module; the tests name a tiny one, and `--warm` other modules to import). The agent and each rank then start in milliseconds, and a restart
by torchrun (--max-restarts) forks from the same warm spare: torch is imported once per launch and node, not
once by the agent and once per rank and restart.

One thread does everything (a selector over the listening socket, the clients' connections and a pidfd per
child): a fork from a process with other threads could copy a lock some thread held. A client whose
connection closes (torchrun SIGKILLed it) has its rank SIGKILLed. The spare dies with the launcher
(PR_SET_PDEATHSIG), and its ranks die with the spare; SIGTERM makes it stop accepting, pass SIGTERM to its
ranks and exit once they ended. Anything it cannot do is written to SPARE_DIR/refused.txt: the clients then
start their ranks the plain way.

The same loop is a spare server's (`--server`, worker/spare_server.py): its one entry is this module, so each launch's
spare is forked from a process that imported torch once for many launches (`--served`: the launcher is not the
spare's parent; the server kills it when the launcher's connection closes).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import json
import logging
import os
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from musubi.contract.env import MUSUBI_CLIENT_PID
from musubi.contract.exits import EXIT_FAILED, EXIT_OK
from musubi.contract.run_files import RUN_FILES
from musubi.contract.spare_client import (
    LOG_NAME,
    LOG_PATH_NAME,
    REFUSED_NAME,
    SOCKET_NAME,
    receive_message,
    send_message,
)
from musubi.tasks import registry
from musubi.worker.spare_path import fresh_path, server_base_path

log = logging.getLogger("musubi.spare")

#: What a rank imports before its first step, imported here once (each costs seconds in a new interpreter).
RANK_MODULES = ("torch", "torch.distributed", "torch.distributed.checkpoint", "torch._dynamo", "musubi.worker.rank")
#: What torchrun's agent imports beyond them (~20 ms more once the rank's modules are in).
AGENT_MODULES = ("torch.distributed.run",)
#: The rank's entry: a module with `main(argv, started=...) -> int`, what a client's fall-back runs as `-m`.
WORKER_ENTRY = "musubi.worker.worker"
#: torchrun's agent behind the bound rendezvous (contract/rendezvous.py), the same kind of entry.
AGENT_ENTRY = "musubi.contract.rendezvous"
#: This module: the one entry a spare server (worker/spare_server.py) serves, a launch's whole spare.
SPARE_ENTRY = "musubi.worker.spare"
#: Seconds a connected client gets to send its request (a stalled one must not hold the spare).
REQUEST_TIMEOUT_S = 10.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: Signals the spare sets handlers for; a rank gets the defaults back.
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when the thread that created it ends; at once if `parent` is already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent ended before the prctl: nobody would kill us later
        os._exit(EXIT_FAILED)


def unsupported(parent: int) -> str | None:
    """Set this process to die with the launcher; why a spare cannot run here (no prctl, no pidfd), or None."""
    try:
        die_with_parent(parent)
        os.close(os.pidfd_open(os.getpid()))  # each rank's end is read from a pidfd (Linux 5.3)
    except (AttributeError, OSError) as e:
        return f"the warm spare cannot run on this system ({e})"
    return None


def job_config(job_dir: Path) -> dict | None:
    """The job's resolved config from JOB_DIR/job.json (the launcher's copy in the spare's folder), or None."""
    try:
        config = json.loads((job_dir / RUN_FILES.job).read_text(encoding="utf-8"))["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return config if isinstance(config, dict) else None


def task_module(config: dict | None) -> str | None:
    """The module the job's task lives in, or None."""
    task = config.get("task") if config is not None else None
    return registry.task_module(task) if isinstance(task, str) else None


def warm(job_dir: Path, modules: list[str]) -> list[str]:
    """Import `modules` (those a rank imports before its first step), the job's task module and what a built-in
    task's model is built from (Task.preload: transformers for a DETR, effdet); the task modules that failed (the
    rank imports them again and reports the error itself)."""
    for name in modules:
        importlib.import_module(name)
    failed = []
    config = job_config(job_dir)  # read once: the task module and the preload both come from it
    name = task_module(config)
    if name is not None:
        if os.getcwd() not in sys.path:  # like tasks/registry.py: user modules resolve from the working folder
            sys.path.insert(0, os.getcwd())
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank's own import names the error in one line
            failed.append(name)
        else:
            preload(config)
    return failed


def preload(config: dict | None) -> None:
    """A built-in task's model libraries (Task.preload), from the job's config. Only built-in tasks: a user task is
    built by calling the user's function, which the spare does not run. Any failure is the rank's to report: it
    builds the model itself."""
    try:
        if config is None or config.get("task") not in registry.BUILTIN_TASK_CLASSES:
            return
        from musubi.config.load import job_from_dict

        registry.build_task(job_from_dict(config)).preload()
    except Exception:  # noqa: BLE001 - the rank builds the model itself and names any error
        return


def live_threads() -> int:
    """Threads of this process a fork would leave behind: counted after a probe fork, since a library that
    stops its pool at fork (OpenBLAS, through pthread_atfork) leaves none."""
    if len(os.listdir("/proc/self/task")) == 1:
        return EXIT_FAILED
    pid = os.fork()
    if pid == 0:
        os._exit(EXIT_OK)
    os.waitpid(pid, 0)
    return len(os.listdir("/proc/self/task"))


def cuda_initialized() -> bool:
    """Whether this process has initialized CUDA (cuInit opens the driver's device files): a child forked after
    that cannot use the GPU. The driver library merely mapped is not that: on the 2x H200 image (torch 2.11) the
    spare's imports map libcuda.so, and refusing on it turned the spare off on every GPU run (BENCHMARKS.md, Recovery).
    A DataLoader parent forks its workers with the library mapped too. So the test is the device files cuInit
    opens and torch's own flag."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return True
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/nvidia"):
                return True
        except OSError:
            continue
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return any(" /dev/nvidia" in line for line in f)
    except OSError:
        return False


def peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (SO_PEERCRED: pid, uid, gid)."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


@dataclass
class Child:
    """A rank the spare forked, the client connection it answers to, and its pidfd (readable once it ended)."""

    pid: int
    conn: socket.socket
    pidfd: int
    connected: bool = True


@dataclass
class Spare:
    """The listening socket and the ranks forked so far."""

    spare_dir: Path
    listener: socket.socket
    sel: selectors.BaseSelector
    entries: tuple[str, ...]  # the modules a client may ask for (the allowlist)
    threads: str | None = None  # OMP_NUM_THREADS when the spare imported torch (its thread pools' size)
    base_path: list[str] | None = None  # a server's sys.path past its own cwd and PYTHONPATH (fresh_path); else None
    start_env: dict[str, str] | None = None  # a server's environment as it started (import_time_mismatch)
    children: dict[int, Child] = field(default_factory=dict)  # by pid
    log_taken: bool = False  # writes to the job's log (take_log)
    stop_asked: bool = False  # set by a signal handler; serve() acts on it
    stopping: bool = False

    def serve(self) -> None:
        """Accept clients and reap ranks until asked to stop and no rank is left."""
        while not (self.stopping and not self.children):
            self.take_log()
            for key, _ in self.sel.select(timeout=0.5):
                kind, payload = key.data
                if kind == "accept" and not self.stop_asked:
                    self.accept()
                elif kind == "exit":
                    self.reap(payload)
                elif kind == "client":  # the client's end closed (or it sent what it should not): its rank goes
                    self.client_gone(payload)
            if self.stop_asked and not self.stopping:
                self.stopping = True
                self.sel.unregister(self.listener)
                self.listener.close()
                for c in self.children.values():
                    _kill(c.pid, signal.SIGTERM)

    def ask_stop(self, signum: int, frame: object) -> None:  # noqa: ARG002
        """SIGTERM/SIGINT/SIGHUP: accept no more clients, pass SIGTERM to the ranks, exit once they ended."""
        self.stop_asked = True

    def accept(self) -> None:
        """One client: check its uid, read its request, fork its rank, send it the rank's pid."""
        conn, _ = self.listener.accept()
        try:
            client, uid = peer(conn)
            if uid != os.getuid():
                send_message(conn, {"refused": "the warm spare serves its own user only"})
                conn.close()
                return
            conn.settimeout(REQUEST_TIMEOUT_S)
            req, fds = receive_message(conn, max_fds=3)
        except OSError:
            conn.close()
            return
        if req is None or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        conn.settimeout(None)
        entry = req.get("module")
        why = self.refusal(entry, req)
        if why is not None:
            with contextlib.suppress(OSError):
                send_message(conn, {"refused": why})
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        self.take_log()
        sys.stdout.flush()
        sys.stderr.flush()
        # A signal between the fork and the child's own handlers waits (blocked) for the defaults, not ours.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
        pid = os.fork()
        if pid == 0:
            become(entry, req, fds, os.getppid(), self.own_fds(conn), client, self.threads, self.base_path)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)
        what = {AGENT_ENTRY: "torchrun agent", WORKER_ENTRY: "rank", SPARE_ENTRY: "warm spare"}.get(entry, entry)
        print(f"{what} pid {pid} forked for client pid {client}", file=sys.stderr, flush=True)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        child = Child(pid, conn, pidfd)
        self.children[pid] = child
        self.sel.register(pidfd, selectors.EVENT_READ, ("exit", child))
        self.sel.register(conn, selectors.EVENT_READ, ("client", child))
        try:
            send_message(conn, {"pid": pid})
        except OSError:
            _kill(pid, signal.SIGKILL)

    def refusal(self, entry: str | None, req: dict) -> str | None:
        """Why this request is not forked here (the client then starts its process the plain way), or None."""
        if entry not in self.entries:  # never a module a client names: only the launch's own entries
            served = " and ".join([", ".join(self.entries[:-1]), self.entries[-1]] if len(self.entries) > 1
                                   else self.entries)
            return f"the warm spare runs {served} only, not {entry!r}"
        if req.get("python", sys.executable) != sys.executable:  # its modules are this interpreter's
            return f"the warm spare runs {sys.executable}, not {req.get('python')}"
        if self.start_env is not None and (name := import_time_mismatch(req.get("env", {}), self.start_env)):
            return f"{name} differs from the spare server's (read as its imports ran)"
        if (threads := live_threads()) > 1:  # never fork beside a thread: the client starts the plain way
            why = f"{threads} threads alive in the warm spare"
            self.refuse(why)
            return why
        return None

    def take_log(self) -> None:
        """Once the launcher named the job's log (SPARE_DIR/log-path, written when the job's folder exists): what
        the spare wrote so far is copied into it, then its stdout and stderr write there. Looked for on every turn
        of the loop and before every fork, so each fork's line lands in the job's log."""
        if self.log_taken:
            return
        try:
            target = (self.spare_dir / LOG_PATH_NAME).read_text(encoding="utf-8").strip()
        except OSError:
            return  # not named yet
        self.log_taken = True
        sys.stdout.flush()
        sys.stderr.flush()
        early = self.spare_dir / LOG_NAME
        try:
            fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            return  # the launcher copies the early output there when it stops the spare
        try:
            os.write(fd, early.read_bytes())
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            early.unlink()  # copied: the launcher must not copy it again
        except OSError:
            pass
        finally:
            os.close(fd)

    def own_fds(self, conn: socket.socket) -> list[int]:
        """Every fd the spare holds (a rank closes them all): the selector, the listener, the connections."""
        fds = [self.listener.fileno(), conn.fileno()]
        if hasattr(self.sel, "fileno"):
            fds.append(self.sel.fileno())
        for c in self.children.values():
            fds += [c.conn.fileno(), c.pidfd]
        return [fd for fd in fds if fd >= 0]

    def reap(self, child: Child) -> None:
        """The rank ended: its wait status to its client, and the bookkeeping closed."""
        _, status = os.waitpid(child.pid, 0)
        self.sel.unregister(child.pidfd)
        os.close(child.pidfd)
        if child.connected:
            self.sel.unregister(child.conn)
            try:
                send_message(child.conn, {"status": status})
            except OSError:
                pass  # the client is gone already: nobody to tell
        child.conn.close()
        del self.children[child.pid]

    def client_gone(self, child: Child) -> None:
        """The client's connection closed before its rank ended (torchrun killed it): kill the rank."""
        self.sel.unregister(child.conn)
        child.connected = False
        _kill(child.pid, signal.SIGKILL)  # its pidfd then reports the end, and reap() closes the rest

    def refuse(self, why: str) -> None:
        """Tell every later client to start the plain way (they read SPARE_DIR/refused.txt)."""
        refuse(self.spare_dir, why)


def refuse(spare_dir: Path, why: str) -> None:
    """Write why the spare will not serve, for the clients to read and say."""
    tmp = spare_dir / (REFUSED_NAME + ".tmp")
    tmp.write_text(why + "\n", encoding="utf-8")
    os.replace(tmp, spare_dir / REFUSED_NAME)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def become(entry: str, req: dict, fds: list[int], spare_pid: int, spare_fds: list[int], client: int,
           threads: str | None = None, base_path: list[str] | None = None) -> NoReturn:
    """In the forked child: take over the client's fds, environment and state, run the entry (a rank, torchrun's
    agent, or a launch's spare forked by a server), end as a new interpreter running it would (its exit code; an
    uncaught Ctrl-C by SIGINT). `threads`: the spare's OMP_NUM_THREADS when it imported torch; `base_path`: a
    server's sys.path past its cwd and PYTHONPATH (the child's are the request's)."""
    code = EXIT_FAILED
    try:
        for fd in spare_fds:
            os.close(fd)
        # A session of its own, like torchrun's workers: a Ctrl-C of the terminal reaches the client, which
        # forwards it (the agent's client is the launcher's child, in the launcher's group as torchrun was).
        os.setsid()
        die_with_parent(spare_pid)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        follow_ignored_signals(set(req.get("ignored", ())))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)  # blocked around the fork (Spare.accept)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        if base_path is not None:  # `python -m` from the client's folder with its PYTHONPATH, not the server's
            sys.path[:] = fresh_path(base_path)
            importlib.invalidate_caches()  # a module written since the server listed a folder must be found
            sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
            set_by_imports()
        if entry not in (AGENT_ENTRY, SPARE_ENTRY):  # those fork processes that are named by their own clients
            os.environ[MUSUBI_CLIENT_PID] = str(client)  # torchrun's log names this rank by its client's pid
        os.umask(int(req["umask"]))
        os.sched_setaffinity(0, req["affinity"])  # torchrun's NUMA binding (numactl) bound the client
        module = sys.modules[entry]
        sys.argv = [module.__file__ or entry, *req["argv"]]
        follow_thread_count(threads)
        if "numpy" in sys.modules:  # a new interpreter would seed numpy's global generator from fresh entropy
            sys.modules["numpy"].random.seed()
        code = module.main(list(req["argv"]), started=float(req["started"]))
        logging.shutdown()
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):  # what the interpreter does with sys.exit("why")
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_FAILED)
    except KeyboardInterrupt:  # an interpreter ends by SIGINT on an uncaught Ctrl-C: the client mirrors a signal
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = EXIT_FAILED
    except BaseException:  # noqa: BLE001 - the rank's end is its exit code; the traceback goes to its stderr
        traceback.print_exc()
        code = EXIT_FAILED
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # as worker.py's __main__: no interpreter teardown (gloo threads)


def follow_ignored_signals(ignored: set[int]) -> None:
    """In a forked process: the signal dispositions a new interpreter started by its client's parent would have.
    Those the client started with ignored stay ignored (nohup's SIGHUP, `trap '' USR2`, Python's SIGPIPE); every
    other one is back to its default, SIGINT to Python's KeyboardInterrupt: the spare's own stop handlers and what
    the spare inherited ignored from the launcher (a background job's SIGQUIT) are not the rank's, whose client
    torchrun's agent started with SIGQUIT caught, hence at its default."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            if int(sig) in ignored:
                signal.signal(sig, signal.SIG_IGN)
            elif sig == signal.SIGINT:
                signal.signal(sig, signal.default_int_handler)
            elif sig in STOPPING or signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # a signal Python may not set (e.g. one the C library reserves)
            continue


def follow_thread_count(imported: str | None) -> None:
    """torch's intra-op threads as OMP_NUM_THREADS says in this process's environment, as a new interpreter would
    have them: the pools were sized from the spare's environment at its import (OpenMP and MKL read it once), and
    the spare starts before the launcher knows the ranks' pinning. Unset here but set at the import: OpenMP's
    default, a thread per core this process may run on."""
    wanted = os.environ.get("OMP_NUM_THREADS", "").strip()
    torch = sys.modules.get("torch")
    if torch is None or wanted == (imported or "").strip():
        return
    if wanted.isdigit() and int(wanted) > 0:
        torch.set_num_threads(int(wanted))
    elif not wanted:
        torch.set_num_threads(len(os.sched_getaffinity(0)))


#: Variables read as the interpreter starts or torch and its thread libraries import (PYTHONHASHSEED, TORCH_LOGS,
#: TORCHDYNAMO_*, MKL_*): a server whose value differs from a launch's cannot fork that launch's spare.
IMPORT_TIME_PREFIXES = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
#: What the values torch's import sets in os.environ derive from (its inductor cache dir: the temp dir and the user).
IMPORT_INPUTS = ("TMPDIR", "TEMP", "TMP", "USER", "LOGNAME", "USERNAME", "LNAME")
#: Those a forked spare follows itself: sys.path (fresh_path), the intra-op threads (follow_thread_count), bytecode
#: writing, and what torch's import sets in os.environ (set_by_imports).
FOLLOWED = ("PYTHONPATH", "OMP_NUM_THREADS", "PYTHONDONTWRITEBYTECODE", "TORCHINDUCTOR_CACHE_DIR")


def set_by_imports() -> None:
    """In a spare forked by a server, once its environment is the launch's: what the imports write into os.environ,
    written again from it (torch's import sets TORCHINDUCTOR_CACHE_DIR, the given one made absolute or its default
    under the temp dir)."""
    cache_dirs = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if cache_dirs is not None:
        cache_dirs.cache_dir()


#: Read when a process group is made, after the fork, from the launch's environment (the launcher sets them per job).
AFTER_IMPORT_PREFIXES = ("TORCH_NCCL_",)


def import_time_mismatch(env: dict[str, str], start: dict[str, str]) -> str | None:
    """The first variable read at start-up or import whose value in `env` differs from `start` (the server's
    environment as it started), or None."""
    names = {k for k in (*env, *start) if (k.startswith(IMPORT_TIME_PREFIXES) or k in IMPORT_INPUTS)
             and k not in FOLLOWED and not k.startswith(AFTER_IMPORT_PREFIXES)}
    return next((k for k in sorted(names) if env.get(k) != start.get(k)), None)


def listen(spare_dir: Path) -> socket.socket:
    """The listening socket, readable and writable by this user only."""
    path = spare_dir / SOCKET_NAME
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path) + ".tmp")
    finally:
        os.umask(old)
    sock.listen(64)
    os.replace(str(path) + ".tmp", path)  # clients see the socket only once it listens
    return sock


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The spare's command line (the launcher's: launch/spare.py start_spare)."""
    ap = argparse.ArgumentParser(prog="musubi-spare")
    ap.add_argument("spare_dir", type=Path, help="its 0700 folder: the socket, its pid, a refusal")
    ap.add_argument("job_dir", type=Path, help="the job (job.json names its task module)")
    ap.add_argument("parent", type=int, help="the launcher's pid: the spare dies with it")
    ap.add_argument("--entry", action="append", dest="entries",
                    help="a module with main(argv, started) a client may ask for (repeatable; by default the "
                         "rank's and torchrun's agent: the allowlist)")
    ap.add_argument("--warm", default=",".join(RANK_MODULES + AGENT_MODULES),
                    help="modules to import before serving, comma-separated")
    ap.add_argument("--server", action="store_true",
                    help="a spare server (worker/spare_server.py): it forks whole spares, each with the sys.path of "
                         "its request's folder and PYTHONPATH")
    ap.add_argument("--served", action="store_true",
                    help="forked by a spare server, which kills it when the launcher's connection closes (the "
                         "launcher is not its parent)")
    args = ap.parse_args(argv)
    args.entries = tuple(args.entries or ((SPARE_ENTRY,) if args.server else (WORKER_ENTRY, AGENT_ENTRY)))
    return args


def main(argv: list[str] | None = None, started: float | None = None) -> int:  # noqa: ARG001 - an entry's shape
    """`SPARE_DIR JOB_DIR LAUNCHER_PID`: warm up, then serve ranks until stopped. Whatever fails before it
    serves is written to SPARE_DIR/refused.txt at once: a client must not wait out READY_S for a spare that
    died (a dead child of the launcher is a zombie until reaped, alive to a signal 0). `started`: when a server's
    client asked for this spare (unused: an entry's main takes it)."""
    args = parse_args(argv)
    try:
        return run(args)
    except Exception as e:
        with contextlib.suppress(OSError):
            refuse(args.spare_dir, f"the warm spare failed: {type(e).__name__}: {e}")
        raise


def run(args: argparse.Namespace) -> int:
    """Warm up, listen, serve (main's body)."""
    spare_dir, job_dir = args.spare_dir, args.job_dir
    # A served spare's parent is the server: it dies with the server (become), and the server kills it when the
    # launcher's connection closes, so only the pidfd check is left here.
    why = unsupported(os.getppid() if args.served else args.parent)
    if why is not None:
        refuse(spare_dir, why)
        return EXIT_FAILED
    threads = os.environ.get("OMP_NUM_THREADS")  # what torch's thread pools are sized from (follow_thread_count)
    base = server_base_path() if args.server else None  # before any import could add to sys.path
    start_env = dict(os.environ) if args.server else None
    gc.disable()  # the imports' objects live as long as the process: no collection need walk them (worker.py)
    t0 = time.monotonic()
    try:
        failed = warm(job_dir, [m for m in args.warm.split(",") if m] + list(args.entries))
    except Exception as e:  # noqa: BLE001 - any failure: the clients start their ranks the plain way
        refuse(spare_dir, f"the warm spare's imports failed: {type(e).__name__}: {e}")
        return EXIT_FAILED
    gc.collect()
    gc.freeze()
    gc.enable()
    alive = live_threads()
    if alive > 1:
        refuse(spare_dir, f"{alive} threads alive in the warm spare after its imports")
        return EXIT_FAILED
    if cuda_initialized():
        refuse(spare_dir, "the warm spare's imports initialized CUDA (a forked rank could not use it)")
        return EXIT_FAILED
    sel = selectors.DefaultSelector()
    spare = Spare(spare_dir, listen(spare_dir), sel, args.entries, threads,
                  base_path=base, start_env=start_env)
    sel.register(spare.listener, selectors.EVENT_READ, ("accept", None))
    for sig in STOPPING:
        signal.signal(sig, spare.ask_stop)
    print(f"warm spare ready in {time.monotonic() - t0:.2f} s (pid {os.getpid()})"
          + (f"; task module(s) {', '.join(failed)} not imported" if failed else ""), file=sys.stderr, flush=True)
    spare.serve()
    return EXIT_OK


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown of torch's modules: the launcher waits for this exit
