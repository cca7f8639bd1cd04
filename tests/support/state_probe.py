"""A task module that records the state of the process importing it: the warm spare imports a job's task module,
so a job naming `tests.support.state_probe:make` has its spare (plain or forked by a spare server) write what a
spare's imports could see to $STATE_PROBE_OUT/PID.json. It defines no task: only the spare's import is wanted."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def dispositions() -> dict[str, str]:
    """Each signal's handler as ign, dfl or the Python handler's name."""
    out = {}
    for sig in signal.valid_signals():
        try:
            h = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        out[str(int(sig))] = ("ign" if h == signal.SIG_IGN else "dfl" if h == signal.SIG_DFL
                              else getattr(h, "__qualname__", repr(h)))
    return out


def open_fds() -> list[str]:
    """What each open fd points at, a socket or pipe by kind (their inodes differ between any two processes)."""
    out = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own fd, closed already
        out.append(f"{fd}:{target.split(':[')[0]}")
    return out


def state() -> dict:
    """What a spare's task import could read of its process."""
    torch = sys.modules.get("torch")
    mask = os.umask(0)
    os.umask(mask)
    status = dict(ln.split(":\t", 1) for ln in Path("/proc/self/status").read_text().splitlines() if ":\t" in ln)
    return {"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0), "cwd": os.getcwd(),
            "env": dict(os.environ), "sys_path": sys.path, "argv": sys.argv, "umask": mask,
            "affinity": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads() if torch else None,
            "signals": dispositions(), "blocked": status.get("SigBlk", "").strip(), "fds": open_fds(),
            "dont_write_bytecode": sys.dont_write_bytecode, "stdout_line_buffering": sys.stdout.line_buffering}


if os.environ.get("STATE_PROBE_OUT"):
    Path(os.environ["STATE_PROBE_OUT"], f"{os.getpid()}.json").write_text(json.dumps(state()), encoding="utf-8")
