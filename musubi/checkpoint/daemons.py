"""DCP's checkpoint processes that outlive their rank: the record a rank writes, the reaping by others.

A rank's asynchronous saver ("process" mode) runs DCP's checkpoint daemon, which survives a SIGKILLed
rank and holds the launcher's pipes. The rank records the daemon (pid, start time) under the job's
`heartbeat/`; the next attempt's ranks and the launcher end the recorded ones. No torch here: the
launcher reaps after every launch, and importing DCP for it costs most of a second even with
torch already imported (BENCHMARKS.md, start-up).
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

from musubi.contract.run_files import RUN_FILES

log = logging.getLogger("musubi.checkpoint")

_PATTERN = "ckpt-daemon-*.json"


def record_daemon(job_dir: Path, attempt: str, rank: int, pid: int, created: float) -> Path:
    """Record one checkpoint daemon a rank spawned (its pid and start time, so a reused pid is never
    taken for it), one file a daemon under JOB/heartbeat/; returns the file."""
    path = job_dir / RUN_FILES.heartbeat / f"ckpt-daemon-a{attempt}-rank{rank}-{pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "created": created, "host": socket.gethostname(), "attempt": attempt,
                                "rank": rank}), encoding="utf-8")
    return path


def reap_checkpoint_daemons(job_dir: Path, skip_attempt: str | None = None) -> list[int]:
    """End recorded DCP checkpoint processes of this host that outlived their rank; return their pids."""
    import psutil

    killed = []
    host = socket.gethostname()
    for p in sorted((job_dir / RUN_FILES.heartbeat).glob(_PATTERN)):
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if rec.get("host") != host or rec.get("attempt") == skip_attempt:
            continue
        try:
            proc = psutil.Process(int(rec["pid"]))
            if abs(proc.create_time() - float(rec["created"])) < 1.0:  # the same process, not a reused pid
                proc.kill()
                killed.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
            pass
        p.unlink(missing_ok=True)
    if killed:
        log.warning("ended %d checkpoint process(es) left by dead ranks: %s", len(killed), killed)
    return killed
