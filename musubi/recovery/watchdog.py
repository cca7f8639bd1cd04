"""Hang detection: per-rank heartbeats watched by a thread outside the training loop.

The training thread only sets a few attributes (`Heartbeat.beat`: step, phase, a progress
counter); it does no I/O. A watchdog thread per rank publishes them to
`JOB/heartbeat/a{attempt}-rank{r}.json` every interval and reads its peers' files. A rank
whose progress counter has not moved for longer than the timeout of its phase is stalled.
The timeout is derived from observed step times: max(floor_s, factor x the slowest of the
recent steps); setup, evaluation and checkpoints get the collective timeout instead (they are
legitimately long, and the process group's own timeout covers them).

When a hang is seen, every rank's watchdog dumps its own stacks (faulthandler, all threads)
and flight recorder (where torch offers it) into `JOB/logs/hang/`, asks the peers on its host
to dump theirs (SIGUSR1, answered by faulthandler even while Python is blocked in C++, so the
rank that stopped writes its stacks before torchrun ends it), the first to notice writes
`hang-a{attempt}.json` naming the rank(s) that stopped progressing and the phase/collective the
others wait in, and the rank exits with EXIT_HANG, so torchrun restarts the job instead of
letting it hang until the collective timeout.

Who is the culprit: a rank that stops (a dead GPU, an endless loop, SIGSTOP) leaves its peers
waiting in the next collective, so every rank stalls; but the peers went further (into the
next step's forward/backward) before blocking. The ranks with the least progress are the ones
that never joined; the rest are waiting for them.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import psutil

from musubi.config.job import WatchdogSpec
from musubi.contract.exits import EXIT_HANG
from musubi.contract.records import HeartbeatRecord
from musubi.contract.run_files import RUN_FILES
from musubi.contract.world import attempt_id, launched_pid

log = logging.getLogger("musubi.watchdog")

#: The longest wait for the peers' stacks after a hang (their faulthandler writes within milliseconds).
STACKS_WAIT_S = 0.5
#: Phases whose length is not a step's: they get the collective timeout, not the step-derived one.
LONG_PHASES = frozenset({"setup", "eval", "checkpoint", "finish"})
#: What a rank blocked in a phase is waiting for (CPU ranks have no flight recorder to say it).
COLLECTIVES = {
    "forward": "forward (FSDP all-gather / DDP buffer broadcast)",
    "backward": "backward (gradient all-reduce / reduce-scatter)",
    "optimizer": "optimizer step",
    "between steps": "between steps (loss all-reduce, checkpoint decision)",
    "log": "loss all-reduce of a log step",
    "eval": "evaluation (metric all-reduce)",
    "checkpoint": "checkpoint (save planning and barriers)",
    "setup": "setup (process group, batch agreement, resume)",
    "finish": "end of training",
}


class Heartbeat:
    """The training thread's side: plain attribute writes, no I/O, no locks."""

    def __init__(self, window: int = 20, progress: Any = None) -> None:
        self.progress = progress  # goodput.ProgressLog on rank 0
        self.step = 0
        self.phase = "setup"
        self.seq = 0  # progress counter: moves at every phase change
        self.step_times: deque[float] = deque(maxlen=window)
        self.t_train_start: float | None = None  # wall time of the first step of this attempt
        self.resumed_step = 0
        self._t_step = time.perf_counter()
        self._t_phase = self._t_step
        # The last duration of evaluation (a checkpoint's may include waiting for the previous save: not derived).
        self.phase_times: dict[str, float] = {}

    def beat(self, phase: str) -> None:
        """Enter `phase` (progress)."""
        if phase != self.phase:
            now = time.perf_counter()
            if self.phase == "eval":
                self.phase_times[self.phase] = now - self._t_phase
            self._t_phase = now
        if self.t_train_start is None and phase == "forward":
            self.t_train_start = time.time()
            self._t_step = time.perf_counter()
            if self.progress is not None:
                self.progress.train_start(self.t_train_start, self.step)
        elif phase == "forward" and self.phase in LONG_PHASES:
            # A step is timed from its first forward: evaluation and checkpoint time between two
            # steps would inflate the step-derived hang timeout.
            self._t_step = time.perf_counter()
        self.phase = phase
        self.seq += 1

    def stepped(self, step: int) -> None:
        """Optimizer step `step` is done."""
        now = time.perf_counter()
        self.step_times.append(now - self._t_step)
        self._t_step = now
        self.step = step
        self.seq += 1
        if self.progress is not None:
            self.progress.stepped(step)


def _atomic_json(path: Path, rec: HeartbeatRecord | dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rec), encoding="utf-8")
    os.replace(tmp, path)


def _stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, a debugger): it handles no signal until continued."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except (psutil.Error, OSError):
        return True  # gone: nothing to wait for either


def _dump_flight_recorder(path: Path) -> bool:
    """This rank's collective flight recorder (NCCL, and gloo where torch records it), if any."""
    try:
        import torch.distributed as dist
        from torch._C import _distributed_c10d as c10d  # noqa: PLC2701 - the only API for the recorder

        if not dist.is_initialized():
            return False
        dump = getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_nccl_trace_json", None)
        if dump is None:
            return False
        data = dump()
    except Exception:  # noqa: BLE001 - diagnostics must never mask the hang
        return False
    path.write_bytes(data if isinstance(data, bytes) else str(data).encode())
    return True


class Watchdog:
    """One rank's watcher thread: publishes this rank's heartbeat, judges every rank's."""

    def __init__(self, job_dir: Path, rank: int, world_size: int, spec: WatchdogSpec, collective_timeout_s: float,
                 heartbeat: Heartbeat, exit_fn: Any = None) -> None:
        self.job_dir, self.rank, self.size, self.spec = job_dir, rank, world_size, spec
        self.collective_timeout_s = collective_timeout_s
        self.hb = heartbeat
        self.attempt = attempt_id()
        self.dir = job_dir / RUN_FILES.heartbeat
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hang_dir = job_dir / RUN_FILES.hangs
        self._exit = exit_fn or (lambda code: os._exit(code))
        self._stop = threading.Event()
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (seq, local monotonic time it last moved)
        self._thread = threading.Thread(target=self._run, name="musubi-watchdog", daemon=True)
        self.pid = os.getpid()
        self.launched_pid = launched_pid()
        self.host = socket.gethostname()
        self.stacks = self._stacks_of(self.rank)
        self._stacks_file: Any = None

    # -- timeouts ----------------------------------------------------------------
    def step_timeout(self) -> float:
        """max(floor, factor x slowest recent step), in seconds."""
        slowest = max(self.hb.step_times, default=0.0)
        return max(self.spec.floor_s, self.spec.factor * slowest)

    def timeout_for(self, phase: str) -> float:
        """The stall allowed in `phase`."""
        if phase in self.hb.phase_times:
            # Evaluation: derived from its own last duration, never above the collective timeout.
            derived = max(self.spec.floor_s, self.spec.factor * self.hb.phase_times[phase], self.step_timeout())
            return min(derived, self.collective_timeout_s)
        if phase in LONG_PHASES:
            return max(self.step_timeout(), self.collective_timeout_s)
        return self.step_timeout()

    def interval(self) -> float:
        return max(0.1, min(1.0, self.spec.floor_s / 10))

    # -- the thread --------------------------------------------------------------
    def start(self) -> None:
        """Start watching (a daemon thread); a peer's SIGUSR1 makes this rank dump its stacks."""
        self.hang_dir.mkdir(parents=True, exist_ok=True)
        self._stacks_file = open(self.stacks, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the handler
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, file=self._stacks_file, all_threads=True)
        self._publish()
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (end of training); the last heartbeat says 'finish'."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._publish()
        if self._stacks_file is not None:
            if hasattr(signal, "SIGUSR1"):
                faulthandler.unregister(signal.SIGUSR1)
            self._stacks_file.close()
            self._stacks_file = None
            if self.stacks.stat().st_size == 0:
                self.stacks.unlink()

    def _path(self, rank: int) -> Path:
        return self.dir / f"a{self.attempt}-rank{rank}.json"

    def _publish(self) -> None:
        hb = self.hb
        rec = HeartbeatRecord(rank=self.rank, pid=self.pid, launched_pid=self.launched_pid, host=self.host, attempt=self.attempt, step=hb.step,
                              phase=hb.phase, seq=hb.seq, time=round(time.time(), 3),
                              timeout_s=round(self.timeout_for(hb.phase), 2), t_train_start=hb.t_train_start,
                              resumed_step=hb.resumed_step)
        try:
            _atomic_json(self._path(self.rank), rec)
        except OSError as e:  # a full disk must not kill the watchdog
            log.warning("heartbeat not written: %s", e)

    def _read(self, rank: int) -> dict[str, Any] | None:
        if rank == self.rank:
            hb = self.hb
            return {"rank": rank, "step": hb.step, "phase": hb.phase, "seq": hb.seq}
        try:
            return json.loads(self._path(rank).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # not started yet, or being replaced

    def _run(self) -> None:
        while not self._stop.wait(self.interval()):
            self._publish()
            stalled = self.check(time.monotonic())
            if stalled is not None and not self._stop.is_set():
                self.on_hang(stalled)
                return

    def check(self, now: float) -> dict[int, dict[str, Any]] | None:
        """Every rank's state if some rank has stalled past its phase's timeout, else None."""
        states: dict[int, dict[str, Any]] = {}
        stalled = False
        for r in range(self.size):
            st = self._read(r)
            if st is None:
                continue
            seq = int(st["seq"])
            prev = self._seen.get(r)
            if prev is None or prev[0] != seq:
                self._seen[r] = (seq, now)
                prev = self._seen[r]
            st["stalled_s"] = round(now - prev[1], 2)
            st["timeout_s"] = round(self.timeout_for(st["phase"]), 2)
            states[r] = st
            if st["phase"] != "finish" and st["stalled_s"] > st["timeout_s"]:
                stalled = True
        return states if stalled else None

    # -- what a hang does ----------------------------------------------------------
    def _stacks_of(self, rank: int) -> Path:
        return self.hang_dir / f"stacks-a{self.attempt}-rank{rank}.txt"

    def _ask_peers_for_stacks(self, states: dict[int, dict[str, Any]]) -> list[int]:
        """SIGUSR1 to the peers on this host (their faulthandler writes their stacks); wait until each peer that can
        answer has (its stacks file grew), at most STACKS_WAIT_S. A stopped peer (SIGSTOP) cannot answer before it
        is killed: it is not waited for (a fixed 0.5 s wait was a hang's whole detection-to-exit time)."""
        asked, pending = [], {}
        for r, st in states.items():
            if r == self.rank or st.get("host") != self.host or not st.get("pid"):
                continue
            before = self._stacks_of(r).stat().st_size if self._stacks_of(r).exists() else 0
            try:
                os.kill(int(st["pid"]), signal.SIGUSR1)
                asked.append(r)
            except (OSError, AttributeError):
                continue
            if not _stopped(int(st["pid"])):
                pending[r] = before
        deadline = time.monotonic() + STACKS_WAIT_S
        while pending and time.monotonic() < deadline:
            time.sleep(0.01)
            for r, before in list(pending.items()):
                path = self._stacks_of(r)
                if path.exists() and path.stat().st_size > before:
                    del pending[r]
        if pending:  # a writer may still be mid-dump: a moment more for its last frames
            time.sleep(0.05)
        return asked

    def _end_stopped(self, states: dict[int, dict[str, Any]], culprits: list[int]) -> list[int]:
        """SIGKILL the culprits on this host that are stopped (SIGSTOP, a debugger's stop): the attempt is over, and
        torchrun's teardown sends SIGTERM, which a stopped process never acts on, then waits 30 s before SIGKILL
        (bench/soak.py measured that wait as the whole of a hang's teardown)."""
        ended = []
        for r in culprits:
            st = states.get(r, {})
            if r == self.rank or st.get("host") != self.host or not st.get("pid"):
                continue
            try:
                proc = psutil.Process(int(st["pid"]))
                # A rank forked by the launch's warm spare shows the spare's command line (musubi.worker.spare).
                if proc.status() == psutil.STATUS_STOPPED and "musubi.worker" in " ".join(proc.cmdline()):
                    proc.kill()
                    ended.append(r)
            except (psutil.Error, OSError):
                continue
        return ended

    def on_hang(self, states: dict[int, dict[str, Any]]) -> None:
        """Dump stacks and the flight recorder, name the culprit(s), end this rank (torchrun restarts)."""
        tag = f"a{self.attempt}-rank{self.rank}"
        self.hang_dir.mkdir(parents=True, exist_ok=True)
        with open(self.stacks, "a", encoding="utf-8") as f:
            f.write(f"rank {self.rank} pid {self.pid}: stacks of every thread at hang detection\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        asked = self._ask_peers_for_stacks(states)
        fr = _dump_flight_recorder(self.hang_dir / f"flight-recorder-{tag}.json")
        report = describe_hang(states, self.attempt)
        report["stacks"] = str(self.hang_dir / f"stacks-a{self.attempt}-rank*.txt")
        report["stacks_requested_from"] = asked
        report["flight_recorder"] = fr
        pending = pending_collectives(self.hang_dir / f"flight-recorder-{tag}.json") if fr else []
        if pending:
            # The operation itself, from this rank's recorder: what it waits in, by sequence number.
            op = pending[0]
            report["pending_collectives"] = pending
            report["collective"] = (f"{op['profiling_name']} (process group {op['pg_id']}, collective #"
                                    f"{op['collective_seq_id']}, sizes {op['input_sizes']}) in {report['collective']}")
            report["message"] += (f"; rank {self.rank}'s flight recorder: {op['profiling_name']} #"
                                  f"{op['collective_seq_id']} of process group {op['pg_id']} never completed")
        report["detected_by"] = self.rank
        path = self.hang_dir / f"hang-a{self.attempt}.json"
        try:  # the first rank to notice writes the report; the others keep their stacks only
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1)
        except FileExistsError:
            pass
        ended = self._end_stopped(states, report["culprits"])  # after the report: it is what detection means
        if ended:
            log.error("rank(s) %s were stopped (SIGSTOP): killed so that the restart need not wait for them",
                      ", ".join(map(str, ended)))
        log.error("%s; stacks in %s; ending this attempt so torchrun restarts the job", report["message"],
                  self.hang_dir)
        logging.shutdown()
        self._exit(EXIT_HANG)


def pending_collectives(path: Path) -> list[dict[str, Any]]:
    """The collectives a flight recorder dump holds as not finished (oldest first); [] if unreadable.

    NCCL entries move to state `completed`; gloo's stay `scheduled` and are `retired` when done.
    """
    try:
        entries = json.loads(path.read_text(encoding="utf-8")).get("entries") or []
    except (OSError, ValueError, AttributeError):
        return []
    keys = ("profiling_name", "pg_id", "collective_seq_id", "input_sizes", "state")
    return [{k: e.get(k) for k in keys} for e in entries  # in the recorder's order
            if isinstance(e, dict) and not e.get("retired") and e.get("state") != "completed"]


def describe_hang(states: dict[int, dict[str, Any]], attempt: str) -> dict[str, Any]:
    """Who stopped (least progress) and where the others wait, as a record with a one-line message."""
    least = min(int(s["seq"]) for s in states.values())
    culprits = sorted(r for r, s in states.items() if int(s["seq"]) == least)
    waiting = sorted(r for r in states if r not in culprits)
    c = states[culprits[0]]
    if waiting:
        w = states[waiting[0]]
        where = COLLECTIVES.get(w["phase"], w["phase"])
        msg = (f"hang: rank(s) {', '.join(map(str, culprits))} stopped progressing at step {c['step']} "
               f"({c['phase']}) for {c['stalled_s']:.0f}s (timeout {c['timeout_s']:.0f}s); rank(s) "
               f"{', '.join(map(str, waiting))} wait in {where} of step {int(w['step']) + 1}")
    else:
        where = COLLECTIVES.get(c["phase"], c["phase"])
        msg = (f"hang: every rank stopped in {where} at step {c['step']} for {c['stalled_s']:.0f}s "
               f"(timeout {c['timeout_s']:.0f}s): a collective that never completes")
    return {"attempt": attempt, "time": time.time(), "culprits": culprits, "waiting": waiting,
            "collective": where, "ranks": {str(r): s for r, s in states.items()}, "message": msg}
