"""Restarts that run out: a rank killed in every attempt, every checkpoint corrupted; the cause names the rank."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from musubi.checkpoint.checkpoint import MARKER
from musubi.cli import app

pytestmark = pytest.mark.slow


def _corrupt_committed_shards(ckpt_root: Path, stop: threading.Event) -> None:
    """Flip one byte (same size) in every committed checkpoint's shards, as soon as its marker exists."""
    done: set[tuple[str, float]] = set()
    while not stop.is_set():
        for marker in ckpt_root.glob(f"step-*/{MARKER}") if ckpt_root.is_dir() else []:
            for shard in marker.parent.glob("*.distcp"):
                try:
                    key = (str(shard), shard.stat().st_mtime)
                    if key in done:
                        continue
                    data = bytearray(shard.read_bytes())
                    data[len(data) // 2] ^= 0xFF
                    shard.write_bytes(bytes(data))
                    done.add((str(shard), shard.stat().st_mtime))
                except OSError:
                    continue  # the directory was replaced or removed meanwhile
        time.sleep(0.02)


@pytest.mark.timeout(240)
def test_restarts_run_out_name_the_killed_rank(tiny_job, tmp_path: Path, monkeypatch) -> None:
    """Rank 1 is SIGKILLed in every attempt and every committed checkpoint is corrupted behind the run's back:
    the restart starts from step 0 (no '--resume' error), logs the gap in one line, and when the restarts run
    out the error, goodput.json, job.json and the fleet's cause name rank 1 (not the peer that lost it)."""
    from musubi.fleet.jobs import failure_cause
    job = tiny_job(checkpoint={"every_steps": 3, "async_mode": "thread"}, watchdog={"floor_s": 5},
                   train={"max_restarts": 1})
    monkeypatch.setenv("MUSUBI_INJECT", "kill:rank=1,every=5")
    root = tmp_path / "run" / "tiny" / "checkpoints"
    stop = threading.Event()
    th = threading.Thread(target=_corrupt_committed_shards, args=(root, stop), daemon=True)
    th.start()
    try:
        res = CliRunner().invoke(app, ["train", str(job), "--nproc", "2", "--device", "cpu",
                                       "--out", str(tmp_path / "run")])
    finally:
        stop.set()
        th.join()
    job_dir = tmp_path / "run" / "tiny"
    assert res.exit_code != 0, res.output
    assert "rank 1" in res.output and "Connection reset" not in res.output, res.output
    good = json.loads((job_dir / "goodput.json").read_text())
    assert good["attempts"] == 2 and [f["ranks"] for f in good["failures"]] == [[1], [1]], good["failures"]
    assert good["failures"][-1]["resumed_from_step"] is None  # the failure that ended the job is recorded
    entry = json.loads((job_dir / "job.json").read_text())["history"][-1]
    assert entry["restarts"] == 1 and [f["attempt"] for f in entry["failures"]] == ["1.0", "1.1"], entry
    assert "rank 1" in entry["error"]
    cause = failure_cause(job_dir, 1)
    assert "(rank 1)" in cause and "Connection" not in cause, cause
    log0 = (job_dir / "logs" / "rank0.log").read_text()
    assert "--resume" not in log0 and "restarting from step 0" in log0, log0[-3000:]
    assert re.search(r"attempt 1\.1 after 1\.0 failed \((killed|rank died) \(rank 1\).*\): it reached step \d, "
                     r"resumed from step 0: \d step\(s\) to redo, [\d.]+ s down", log0), log0[-3000:]
    # the report shows goodput and each failure's cause and cost; the checklist names the rank
    from musubi.diagnose.report import build_report
    from musubi.records.checklist import build_checklist

    html = Path(build_report(tmp_path / "run")["html"]).read_text()
    text = re.sub(r"<[^>]+>", " ", html)
    assert "Reliability: goodput, restarts, checkpoints" in text and "Goodput" in text
    assert "2 failure(s)" in text and "failed at step" in text and "1.1" in text
    items = {(i.job, i.check): i for i in build_checklist(tmp_path / "run").items}
    assert items[("tiny", "restarts")].status == "FAIL" and "(rank 1)" in items[("tiny", "restarts")].found
