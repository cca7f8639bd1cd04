"""The torch-free reading of checkpoints (musubi/checkpoint/committed.py): what the launcher's --resume check uses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from musubi.checkpoint.committed import MARKER, committed_checkpoints, latest_checkpoint, step_dir


def _commit(root: Path, step: int, payload: bytes = b"weights") -> Path:
    d = step_dir(root, step)
    d.mkdir(parents=True)
    (d / "shard.distcp").write_bytes(payload)
    (d / MARKER).write_text(json.dumps({"step": step, "files": {"shard.distcp": len(payload)}}))
    return d


def test_newest_intact_checkpoint_without_torch(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    assert latest_checkpoint(root) is None
    _commit(root, 4)
    _commit(root, 8)
    (_commit(root, 12) / "shard.distcp").write_bytes(b"cut")  # resized after its commit: damaged
    (step_dir(root, 16)).mkdir()  # a save that died before its marker
    assert latest_checkpoint(root, warn=False).step == 8
    assert [c.step for c in committed_checkpoints(root, warn=False)] == [4, 8]
    code = ("import sys; from pathlib import Path; from musubi.checkpoint.committed import latest_checkpoint; "
            f"print(latest_checkpoint(Path({str(root)!r}), warn=False).step, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["8", "False"]  # the launcher's --resume check imports no torch


def test_the_launchs_resume_check_is_a_cheap_one() -> None:
    from musubi.launch.checks import CHECKS

    assert not next(c for c in CHECKS if c.name == "resume checkpoint").torch
