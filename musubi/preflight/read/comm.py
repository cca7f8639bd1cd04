"""The communication reading: start the all-reduce probe, then collect what it measured.

NCCL on one node runs as one process driving every GPU (`allreduce_probe --single`: seconds, not
the ten or more a torchrun of N ranks costs); gloo CPU ranks run under torchrun. Set
MUSUBI_COMM_PROBE=torchrun to force the per-rank form (one process per GPU, as training runs).

The probe runs as a child process group (its own session), so a hung NCCL
init is killed at the timeout instead of hanging the check. It starts early
and is collected last: the other readings are taken while it runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from musubi.contract.env import MUSUBI_COMM_PROBE
from musubi.preflight.readings import CommReading

#: Bytes per rank of the timed all-reduce: large enough to reach link bandwidth, small enough for any GPU.
GPU_BYTES = 256 << 20
#: gloo on CPU ranks: only proves the path works; there is no bandwidth target.
CPU_BYTES = 4 << 20

_TRANSPORT = re.compile(r"via (P2P|SHM|NET|CollNet)")


def parse_transports(log: str) -> tuple[str, ...]:
    """NCCL transports its INFO log shows channels using ('via P2P/IPC', 'via SHM/direct', 'via NET/IB')."""
    return tuple(sorted(set(_TRANSPORT.findall(log))))


def _error_line(log: str) -> str | None:
    """The most telling line of a failed probe's log: an NCCL WARN, else the last error-looking line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for pattern in ("NCCL WARN", "Error", "error"):
        hits = [ln for ln in lines if pattern in ln]
        if hits:
            return hits[-1][:300]
    return lines[-1][:300] if lines else None


def probe_launcher(backend: str, env: dict[str, str] | os._Environ[str]) -> str:
    """'single' (one process, every GPU) for NCCL unless MUSUBI_COMM_PROBE=torchrun; gloo is always torchrun."""
    if backend != "nccl":
        return "torchrun"
    choice = env.get(MUSUBI_COMM_PROBE, "single").strip().lower()
    return "torchrun" if choice == "torchrun" else "single"


class CommProbe:
    """A running all-reduce probe (torchrun child); `result()` waits for it and reads the measurement."""

    def __init__(self, backend: str, ranks: int, visible_devices: str | None, timeout_s: float = 90.0,
                 nbytes: int | None = None, iters: int | None = None) -> None:
        """Start the probe over `ranks` devices; `visible_devices` becomes its CUDA_VISIBLE_DEVICES."""
        self.backend, self.ranks, self.timeout_s = backend, ranks, timeout_s
        self.nbytes = nbytes or (GPU_BYTES if backend == "nccl" else CPU_BYTES)
        self.dir = Path(tempfile.mkdtemp(prefix="musubi-preflight-"))
        self.out, self.log_path = self.dir / "allreduce.json", self.dir / "allreduce.log"
        from musubi.contract.rendezvous import single_node_env, torchrun_module

        self.launcher = probe_launcher(backend, os.environ)
        probe_args = ["-m", "musubi.preflight.allreduce_probe",
                      "--out", str(self.out), "--backend", backend, "--bytes", str(self.nbytes),
                      "--iters", str(iters or (20 if backend == "nccl" else 5)), "--timeout-s", str(timeout_s)]
        if self.launcher == "single":
            argv = [sys.executable, *probe_args, "--single"]
        else:
            argv = [sys.executable, *torchrun_module(), "--standalone", "--nnodes=1",
                    f"--nproc-per-node={ranks}", "--max-restarts=0", *probe_args]
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
        env.update(single_node_env(env))  # rendezvous and rank sockets on loopback, like a training job
        if visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_devices
        if backend == "nccl":
            # The INFO log names the transport of every channel (P2P, SHM, NET): the likely cause of a slow link.
            env["NCCL_DEBUG"] = "INFO"
            env["NCCL_DEBUG_SUBSYS"] = "INIT,P2P,SHM,NET"
            env.pop("NCCL_DEBUG_FILE", None)
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in result()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def _kill(self) -> None:
        """SIGKILL torchrun, then every rank (each leads its own session, so torchrun's group misses them)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # first, so no rank is started after the sweep
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for f in self.dir.glob("allreduce.json.rank*.pid"):
            try:
                os.killpg(int(f.read_text(encoding="utf-8")), signal.SIGKILL)
            except (ValueError, OSError):  # already gone (or the file was half written)
                pass

    def cancel(self) -> None:
        """Kill the probe and drop its files (the check was interrupted)."""
        self._kill()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def result(self) -> CommReading:
        """Wait (up to the timeout, counted from the start) and read the measurement or the failure."""
        left = max(0.0, self.timeout_s - (time.perf_counter() - self.started))
        timed_out = False
        try:
            code = self.proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            self._kill()
            timed_out, code = True, None
        except BaseException:
            self._kill()
            raise
        finally:
            self._log.close()
        log = self.log_path.read_text(encoding="utf-8", errors="replace")
        base = {"backend": self.backend, "ranks": self.ranks, "nbytes": self.nbytes, "timeout_s": self.timeout_s,
                "transports": parse_transports(log), "log_path": str(self.log_path), "launcher": self.launcher,
                "wall_s": time.perf_counter() - self.started}
        if timed_out:
            return CommReading(**base, timed_out=True, error=f"no result after {self.timeout_s:.0f} s")
        errors = sorted(self.dir.glob("allreduce.json.rank*.err"), key=lambda p: int(p.name.rsplit("rank", 1)[1][:-4]))
        if code != 0 or not self.out.is_file():
            msg = errors[0].read_text(encoding="utf-8") if errors else _error_line(log)
            return CommReading(**base, error=msg or f"torchrun exited with {code}")
        data = json.loads(self.out.read_text(encoding="utf-8"))
        # Keep the log only where it explains something: a failure or a wrong sum.
        if data["correct"]:
            shutil.rmtree(self.dir, ignore_errors=True)
            base["log_path"] = None
        return CommReading(**{**base, "nbytes": int(data["nbytes"])}, seconds=float(data["seconds"]),
                           busbw_gbps=float(data["busbw_gbps"]), correct=bool(data["correct"]))
