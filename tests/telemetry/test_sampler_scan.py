"""The sampler reads the machine's process table rarely: every RESCAN_S, or sooner for a loader worker it has not
seen; between scans it reads only the children it knows, and drops those that ended."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from musubi.telemetry import sampler as sampler_mod
from musubi.telemetry.sampler import Sampler

pytestmark = pytest.mark.timeout(60)

BUSY = "import time\nt = time.time()\nwhile time.time() - t < 30: pass"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Times psutil's children() (the scan of every pid) was called."""
    calls: list[float] = []
    real = psutil.Process.children

    def counted(self: psutil.Process, recursive: bool = False) -> list[psutil.Process]:
        calls.append(time.monotonic())
        return real(self, recursive=recursive)

    monkeypatch.setattr(psutil.Process, "children", counted)
    return calls


def test_samples_between_scans_do_not_read_the_process_table(tmp_path: Path, scans: list[float]) -> None:
    worker = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        s = Sampler(tmp_path / "s.jsonl", 0, 20.0, None, worker_pids=lambda: [worker.pid])
        time.sleep(1.3)
        s.close()
    finally:
        worker.kill()
        worker.wait()
    recs = _records(tmp_path / "s.jsonl")
    assert len(recs) >= 10  # ~20 a second
    assert len(scans) == 1, f"{len(scans)} scans for {len(recs)} samples"  # before: one per sample
    # the worker found by that one scan is read at every later sample, and measured busy
    assert all(r["workers"] == 1 for r in recs) and recs[-1]["workers_cpu"] > 2, recs[-1]
    assert all(r["self_ms"] >= 0 for r in recs)


def test_a_new_worker_brings_the_scan_forward_and_an_ended_one_is_dropped(
        tmp_path: Path, scans: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_mod, "MIN_RESCAN_S", 0.3)
    pids: list[int] = []
    s = Sampler(tmp_path / "s.jsonl", 0, 20.0, None, worker_pids=lambda: list(pids))
    time.sleep(0.25)  # the first scan (at 0.05 s) finds no worker
    worker = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        pids.append(worker.pid)  # the loader names its new worker (a new epoch)
        time.sleep(1.0)
        named = len(scans)
        worker.kill()
        worker.wait()
        pids.clear()  # the epoch's workers are gone
        time.sleep(0.5)
        s.close()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    recs = _records(tmp_path / "s.jsonl")
    # the first scan, then one brought forward by the named worker; not one per sample (~20 since)
    assert named == 2, scans
    assert scans[1] - scans[0] >= 0.3
    assert any(r["workers"] == 1 for r in recs)
    # it ended: dropped at the next sample (reading it failed), with no scan of the process table
    assert recs[-1]["workers"] == 0 and len(scans) == named
