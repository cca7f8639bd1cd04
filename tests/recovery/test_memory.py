"""Memory: OOM on one rank recovered by a coordinated restart; batch probing agreed by all ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from musubi.cli import app
from musubi.config.batch_plan import plan_for
from musubi.config.load import job_from_dict
from musubi.contract.errors import ConfigError
from musubi.contract.inject import parse
from musubi.recovery.memory import shrink_after_oom
from tests.conftest import TINY_JOB, _merge
from tests.recovery.conftest import DRILL_JOB
from tests.support.runs import final_state, train

OOM_JOB = {"train": {"min_batch": 2}, "checkpoint": {"every_steps": 2}}


def _spec(**train):
    return job_from_dict(_merge(TINY_JOB, {"train": train}))


def test_inject_spec_is_strict() -> None:
    faults = parse("oom:rank=1,step=5,phase=backward; slow:rank=2,factor=1.3;data_stall:ms=200")
    assert [f.kind for f in faults] == ["oom", "slow", "data_stall"]
    for bad, why in [("boom:rank=1", "unknown fault"), ("oom:rank=1,when=3", "bad parameter"),
                     ("oom:phase=sideways", "phase must be"), ("kill:step=x", "not a number"),
                     ("oom_above:rank=1", "needs batch")]:
        with pytest.raises(ConfigError, match=why):
            parse(bad)


def test_oom_policies() -> None:
    rec = {"rank": 1, "phase": "backward", "step": 7}
    keep = _spec(batch=8, lr=0.1, base_batch=16)
    b, acc, why = shrink_after_oom(keep, 8, 1, 2, rec)
    assert (b, acc) == (4, 2) and plan_for(keep, b, acc, 2, "t").lr == pytest.approx(0.1) and "unchanged" in why
    halve = _spec(batch=8, lr=0.1, base_batch=16, oom_policy="halve_global_batch")
    b, acc, why = shrink_after_oom(halve, 8, 1, 2, rec)
    assert (b, acc) == (4, 1) and plan_for(halve, b, acc, 2, "t").lr == pytest.approx(0.05) and "16 -> 8" in why
    # Both say that the smaller batch stays (docs/guides/memory.md: a real OOM comes back at the larger one).
    assert why.endswith("kept for the rest of this job (memory/batch.json)")
    assert shrink_after_oom(keep, 8, 1, 2, rec)[2].endswith("kept for the rest of this job (memory/batch.json)")
    with pytest.raises(ConfigError, match="min_batch=4") as ei:
        shrink_after_oom(_spec(batch=4), 4, 1, 2, rec)
    assert "rank 1 in backward" in str(ei.value) and "\n" not in str(ei.value)


@pytest.fixture(scope="module")
def clean_run(drill_reference: Path) -> dict[str, torch.Tensor]:
    """The same job without faults (2 ranks), for comparison: the recovery drills' session reference, which trains
    the same tiny job (bitwise the same final weights, measured 2026-11-28: only its checkpoint cadence, watchdog
    and min_batch differ, none of which changes a weight), so this file launches no clean run of its own."""
    ours, theirs = _merge(TINY_JOB, OOM_JOB), _merge(TINY_JOB, DRILL_JOB)
    for job in (ours, theirs):
        for key in ("checkpoint", "watchdog"):
            job.pop(key, None)
        job["train"].pop("min_batch", None)
    assert ours == theirs, "the drills' reference is no longer this job without faults: train a clean run here"
    return final_state(drill_reference / "reference" / TINY_JOB["name"])


#: One OOM in each phase, one launch: each is recovered by a coordinated restart that halves the per-rank batch
#: and doubles accumulation (8x1 -> 4x2 -> 2x4 -> 1x8), resuming from the step-4, -8 and -12 checkpoints.
PHASES = ("forward", "backward", "optimizer")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_oom_on_one_rank_recovers_by_coordinated_restart(tiny_job, tmp_path: Path, monkeypatch, clean_run) -> None:
    monkeypatch.setenv("MUSUBI_INJECT", "; ".join(f"oom:rank=1,step={5 + 4 * i},phase={phase}"
                                                  for i, phase in enumerate(PHASES)))
    job = tiny_job(**_merge(OOM_JOB, {"train": {"min_batch": 1}}))
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "r"))
    assert code == 0, out
    jd = tmp_path / "r" / "tiny"
    batch = json.loads((jd / "memory" / "batch.json").read_text())
    assert (batch["per_rank"], batch["accumulation"], batch["global_batch"]) == (1, 8, 16)
    assert len(batch["history"]) == 3, batch["history"]
    for i, phase in enumerate(PHASES):
        assert f"rank 1 in {phase} at step {5 + 4 * i}" in batch["history"][i]
    summary = json.loads((jd / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 16 and summary["restarts"] == 3
    history = json.loads((jd / "job.json").read_text())["history"]
    assert [r["phase"] for r in history[-1]["oom_recoveries"]] == list(PHASES)
    # each failed step was redone from the checkpoint before it: each step logged once, none missing
    steps = [json.loads(ln)["step"] for ln in (jd / "metrics.jsonl").read_text().splitlines()
             if json.loads(ln)["kind"] == "train"]
    assert steps == [4, 8, 12, 16]
    # same global batch and LR: the weights match an unfaulted run within float tolerance
    got = final_state(jd)
    for k in (k for k in clean_run if k.startswith("model.")):
        torch.testing.assert_close(got[k], clean_run[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_repeated_oom_ends_at_the_floor_with_one_line(tiny_job, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MUSUBI_INJECT", "oom_above:rank=1,batch=2")
    code, out = train(str(tiny_job(train={"min_batch": 4})), "--nproc", "2", "--out", str(tmp_path / "r"))
    assert code == 2, out
    line = out.strip().splitlines()[-1]
    assert "out of memory" in line and "min_batch=4" in line and "rank 1" in line


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_probe_agrees_on_the_smallest_rank_and_caches(tiny_job, tmp_path: Path, monkeypatch) -> None:
    job = tiny_job(train={"batch": "auto"})
    monkeypatch.setenv("MUSUBI_INJECT", "oom_above:rank=0,batch=40; oom_above:rank=1,batch=24")
    res = CliRunner().invoke(app, ["train", str(job), "--nproc", "2", "--device", "cpu", "--out",
                                   str(tmp_path / "p1"), "--probe-only"])
    assert res.exit_code == 0, res.output
    probe = json.loads([ln for ln in res.output.splitlines() if ln.startswith("{")][-1])
    assert probe["per_rank_batch"] == 24 and probe["global_batch"] == 48 and probe["source"] == "probe"
    detail = json.loads((tmp_path / "p1" / "tiny" / "memory" / "probe.json").read_text())
    assert detail["local_batch"] == 40  # rank 0's own answer; the agreed one is rank 1's
    assert not (tmp_path / "musubi.db").exists()  # a simulated limit never enters the cache
    # without simulated limits the CPU probe grows to the data cap (64 per rank), then it is cached (the probe
    # writes the cache before a run trains: --probe-only stops there, the training after it is the next launch's)
    monkeypatch.delenv("MUSUBI_INJECT")
    res = CliRunner().invoke(app, ["train", str(job), "--nproc", "2", "--device", "cpu", "--out",
                                   str(tmp_path / "p2"), "--probe-only"])
    assert res.exit_code == 0, res.output
    probe = json.loads([ln for ln in res.output.splitlines() if ln.startswith("{")][-1])
    assert probe["per_rank_batch"] == 64 and probe["source"] == "probe"
    assert (tmp_path / "musubi.db").exists()
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "p3"))
    assert code == 0, out
    summary = json.loads((tmp_path / "p3" / "tiny" / "summary.json").read_text())
    assert summary["batch_source"] == "cache" and summary["per_rank_batch"] == 64
    assert "lr 0.8 = 0.1 x 128/16 (linear rule, base_batch 16)" in (tmp_path / "p3" / "tiny" / "logs" / "rank0.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_batch_far_too_large_recovers_in_one_restart_then_an_oom_on_one_of_four_ranks(tiny_job, tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """4 ranks. No step fits at 32: the restart probes once and jumps to 32/4 = 8 (global batch kept); then an OOM
    on rank 2 alone, in backward at step 3, is recovered by a coordinated restart that halves it (8x4 -> 4x8).

    (Two tests before, a 2-rank launch for the jump and a 4-rank one for the single rank's OOM: one launch now.)"""
    monkeypatch.setenv("MUSUBI_INJECT", "oom_above:batch=10; oom:rank=2,step=3,phase=backward")
    job = tiny_job(train={"batch": 32, "lr": 0.1, "base_batch": 128, "epochs": 1, "min_batch": 2},
                   data={"synthetic": {"train_size": 1024}}, checkpoint={"every_steps": 2})
    code, out = train(str(job), "--nproc", "4", "--oversubscribe", "--out", str(tmp_path / "r"))
    assert code == 0, out
    jd = tmp_path / "r" / "tiny"
    batch = json.loads((jd / "memory" / "batch.json").read_text())
    assert (batch["per_rank"], batch["accumulation"], batch["global_batch"]) == (4, 8, 128)
    assert len(batch["history"]) == 2, batch["history"]
    jump, oom = batch["history"]
    assert "before any step fit" in jump and "per-rank batch 32 -> 8, accumulation 1 -> 4, global batch and LR " \
        "unchanged" in jump, jump
    assert "rank 2 in backward at step 3: per-rank batch 8 -> 4, accumulation 4 -> 8" in oom, oom
    assert json.loads((jd / "summary.json").read_text())["restarts"] == 2  # one restart each
