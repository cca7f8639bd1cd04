"""Checkpoints: partial or damaged ones are skipped; bad resumes fail with one line and destroy nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from musubi.runtime.checkpoint import MARKER, committed_checkpoints, latest_checkpoint, verify
from tests.runtime.helpers import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def finished_run(tiny_job, tmp_path: Path) -> Path:
    """A 2-rank run with committed checkpoints at steps 8 and 16 (end of each epoch)."""
    job = tiny_job()
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "run"))
    assert code == 0, out
    return tmp_path / "run" / "tiny"


def test_partial_and_damaged_checkpoints_are_skipped(finished_run: Path, tiny_job, tmp_path: Path) -> None:
    root = finished_run / "checkpoints"
    assert [c.step for c in committed_checkpoints(root)] == [8, 16]
    # a save that died before its marker
    no_marker = root / "step-000000024"
    shutil.copytree(root / "step-000000016", no_marker)
    (no_marker / MARKER).unlink()
    # a committed save whose shard was truncated afterwards
    damaged = root / "step-000000032"
    shutil.copytree(root / "step-000000016", damaged)
    marker = json.loads((damaged / MARKER).read_text())
    marker["step"] = 32
    (damaged / MARKER).write_text(json.dumps(marker))
    shard = next(damaged.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])
    assert verify(no_marker) is None and verify(damaged) is None
    assert latest_checkpoint(root).step == 16
    # resume takes step 16; the job is already finished, so it ends at once, exit 0
    code, out = train(str(tiny_job()), "--nproc", "2", "--out", str(finished_run.parent), "--resume")
    assert code == 0, out
    assert "resumed from step-000000016" in (finished_run / "logs" / "rank0.log").read_text()


def test_resume_with_nothing_to_resume(tiny_job, tmp_path: Path) -> None:
    code, out = train(str(tiny_job()), "--nproc", "2", "--out", str(tmp_path / "none"), "--resume")
    assert code == 2 and "nothing to resume" in out
    assert not (tmp_path / "none").exists()


def test_existing_run_is_never_overwritten(finished_run: Path, tiny_job) -> None:
    before = (finished_run / "metrics.jsonl").read_bytes()
    code, out = train(str(tiny_job()), "--nproc", "2", "--out", str(finished_run.parent))
    assert code == 2 and "already holds a run" in out and "--resume" in out
    assert (finished_run / "metrics.jsonl").read_bytes() == before


def test_checkpoint_of_another_model_is_refused(finished_run: Path, tiny_job) -> None:
    ckpts = sorted(p.name for p in (finished_run / "checkpoints").iterdir())
    code, out = train(str(tiny_job(model_args={"hidden": 48})), "--nproc", "2", "--out",
                      str(finished_run.parent), "--resume")
    assert code == 2, out
    assert "another model" in out and "\n" not in out.strip().split("error: ", 1)[1].split(" (logs:")[0]
    assert sorted(p.name for p in (finished_run / "checkpoints").iterdir()) == ckpts


def test_other_world_size_is_refused(finished_run: Path, tiny_job) -> None:
    code, out = train(str(tiny_job()), "--nproc", "1", "--out", str(finished_run.parent), "--resume")
    assert code == 2 and "--nproc 2" in out
