"""End-to-end under FSDP2: real torchrun + gloo process groups on CPU, against DDP and across a resume.

Its own file (4 launches), so that `make test`'s workers, which take a file at a time, share the
distributed tests out evenly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.runtime.helpers import final_state, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_fsdp_matches_ddp_and_resumes_exactly(tiny_job, tmp_path: Path) -> None:
    """FSDP2 (fully_shard) on 2 gloo ranks: same weights as DDP; stop/resume is bitwise exact."""
    job = tiny_job(train={"epochs": 1, "deterministic": True}, checkpoint={"every_steps": 3})
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "ddp"))
    assert code == 0, out
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "fsdp"), "--set", "train.strategy=fsdp")
    assert code == 0, out
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "cut"), "--set", "train.strategy=fsdp",
                      "--max-steps", "5")
    assert code == 0, out
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "cut"), "--set", "train.strategy=fsdp",
                      "--resume")
    assert code == 0, out
    ddp, fsdp, cut = (final_state(tmp_path / d / "tiny") for d in ("ddp", "fsdp", "cut"))
    for k in (k for k in ddp if k.startswith("model.")):
        torch.testing.assert_close(fsdp[k], ddp[k], rtol=1e-5, atol=1e-6, msg=k)
    assert set(fsdp) == set(cut)
    for k in fsdp:
        assert torch.equal(fsdp[k], cut[k]), f"{k} differs after FSDP resume"
