"""End-to-end: real torchrun + gloo process groups on CPU (2 and 4 ranks), under DDP and FSDP2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from musubi.store.startup import LAUNCHER, components, marks_of
from musubi.worker.fork_guard import fork_needs_quiet
from tests.conftest import write_tiny_job
from tests.support.runs import final_state, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


#: The job of the module's two reference runs (1 rank x 16 and 2 ranks x 8, deterministic): the 2-rank run is at once
#: the DDP test's 2-rank case, the uninterrupted run of the resume test, the DDP run FSDP2 must match, the run whose
#: files the shared-files test reads and the run whose losses must equal the recorded ones (one launch, not five).
#: 31 validation samples: 16 + 15 over 2 ranks (the validation set draws no sample of the training set's).
REFERENCE = {"train": {"deterministic": True, "epochs": 2, "log_every": 1}, "data": {"workers": 1,
                                                                                     "synthetic": {"val_size": 31}},
             "checkpoint": {"every_steps": 5, "keep_best": 1}}
#: The 2-rank run's loss at every step, recorded before the trainer's step was split into forward_backward /
#: optimizer_step (torch 2.14, CPU, gloo): a refactor of the step must not move them.
EXPECTED_LOSSES = Path(__file__).with_name("expected_losses.json")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference of the DDP tests: 1 rank x the whole batch of 16 (its run directory); run once."""
    root = tmp_path_factory.mktemp("one-rank")
    job = write_tiny_job(root, **REFERENCE)
    code, out = train(str(job), "--nproc", "1", "--out", str(root / "one"), "--set", "train.batch=16")
    assert code == 0, out
    return root / "one" / "tiny"


@pytest.mark.parametrize("ranks", [2, 4])
def test_ddp_equals_one_rank_with_whole_batch(two_ranks: tuple[Path, Path], one_rank: Path, tmp_path: Path,
                                              ranks: int) -> None:
    """DDP over N ranks x B equals 1 rank x N*B (same global batch, same samples per step)."""
    job, two_dir = two_ranks
    if ranks == 2:  # the module's 2-rank run is 2 x 8 already
        dp_dir = two_dir
    else:
        # 4 ranks on a 2-core CI machine: said on purpose (musubi refuses more CPU ranks than cores otherwise);
        # no loader worker (four more processes on 2 cores; the batches are the same)
        code, out = train(str(job), "--nproc", str(ranks), "--out", str(tmp_path / "dp"), "--set",
                          f"train.batch={16 // ranks}", "--set", "data.workers=0", "--oversubscribe")
        assert code == 0, out
        dp_dir = tmp_path / "dp" / "tiny"
    a, b = final_state(dp_dir), final_state(one_rank)
    model_keys = [k for k in a if k.startswith("model.")]
    assert model_keys and set(a) == set(b)
    for k in model_keys:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    # and training did move the weights
    one = json.loads((one_rank / "summary.json").read_text())
    assert one["steps"] == 16 and one["global_batch"] == 16


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The module's 2-rank run to its end (job file, run directory); see REFERENCE."""
    root = tmp_path_factory.mktemp("two-ranks")
    job = write_tiny_job(root, **REFERENCE)
    code, out = train(str(job), "--nproc", "2", "--out", str(root / "full"))
    assert code == 0, out
    return job, root / "full" / "tiny"


def test_stop_and_resume_is_bitwise_exact(two_ranks: tuple[Path, Path], tmp_path: Path) -> None:
    """Stopped at step 11 (mid-epoch) and resumed == never stopped, bit for bit (weights and optimizer)."""
    job, full = two_ranks
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "cut"), "--max-steps", "11")
    assert code == 0, out
    summary = json.loads((tmp_path / "cut" / "tiny" / "summary.json").read_text())
    assert summary["steps"] == 11 and not summary["finished"]
    assert json.loads((tmp_path / "cut" / "tiny" / "job.json").read_text())["status"] == "stopped"
    # Stopped inside an epoch, still validated: eval.json holds the metrics of step 11's weights.
    evals = json.loads((tmp_path / "cut" / "tiny" / "eval.json").read_text())
    assert evals["step"] == 11 and evals["metrics"]["val_count"] == 31.0
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "cut"), "--resume")
    assert code == 0, out
    a, b = final_state(full), final_state(tmp_path / "cut" / "tiny")
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
    record = json.loads((tmp_path / "cut" / "tiny" / "job.json").read_text())
    assert record["attempts"] == 2 and record["status"] == "done"
    # metrics of the discarded timeline are not duplicated
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "cut" / "tiny" / "metrics.jsonl").read_text().splitlines()
             if json.loads(ln)["kind"] == "train"]
    assert steps == sorted(set(steps))


def test_recorded_losses_are_unchanged(two_ranks: tuple[Path, Path]) -> None:
    """A refactor keeps recorded losses identical: the 2-rank run's loss at every step against committed figures."""
    _, jd = two_ranks
    records = [json.loads(ln) for ln in (jd / "metrics.jsonl").read_text().splitlines()]
    losses = [[r["step"], r["loss"]] for r in records if r["kind"] == "train"]
    assert losses == json.loads(EXPECTED_LOSSES.read_text())


def test_rank0_owns_shared_files(two_ranks: tuple[Path, Path]) -> None:
    """Only rank 0 writes shared outputs; each rank has its own log; validation counts each sample once."""
    _, jd = two_ranks
    names = {p.name for p in jd.iterdir()}
    assert {"job.json", "metrics.jsonl", "summary.json", "eval.json", "checkpoints", "logs"} <= names
    assert sorted(p.name for p in (jd / "logs").glob("rank*.log")) == ["rank0.log", "rank1.log"]
    # every rank logs to its own file (rank 1 never prints to the console)
    assert "rank1 INFO" in (jd / "logs" / "rank1.log").read_text()
    records = [json.loads(ln) for ln in (jd / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == sorted(set(train_steps)), "a step was logged twice (more than one writer?)"
    evals = json.loads((jd / "eval.json").read_text())
    # 31 validation samples over 2 ranks: 16 + 15, no padding duplicate
    assert evals["metrics"]["val_count"] == 31.0
    assert len(list((jd / "tensorboard").glob("events.*"))) == 1
    assert "global batch 16 = 8 per rank x 2 ranks x 1 accumulation" in (jd / "logs" / "rank0.log").read_text()
    # The launcher's start-up in parts (store/startup.py LAUNCHER), in the order it passed them, before rank 0's
    marks = marks_of(jd)
    order = ["entered", "admitted", "prepared", "launcher", "worker", "imported"]
    assert [marks[m] for m in order] == sorted(marks[m] for m in order), marks
    parts = components({**marks, "spawned": marks["entered"]})
    launcher = [parts[name] for name, _ in LAUNCHER]  # every part present, together the launcher's whole time
    # Present, not necessarily > 0: the checks can take well under the marks' 1-ms rounding once warm.
    assert parts["launcher: job checks"] >= 0, parts
    assert abs(sum(launcher) - (marks["launcher"] - marks["entered"])) < 0.01, parts


def test_the_ranks_were_forked_by_the_warm_spare(two_ranks: tuple[Path, Path]) -> None:
    """By default each rank is forked from the launch's warm spare (worker/spare.py), not a new interpreter:
    the spare logged rank 0's pid (the one that wrote the start-up marks), and no client fell back."""
    _, jd = two_ranks
    rank0 = {json.loads(ln)["pid"] for ln in (jd / "startup.jsonl").read_text().splitlines()
             if json.loads(ln)["mark"] == "worker"}
    spare_log = (jd / "logs" / "spare.log").read_text()
    assert "warm spare ready" in spare_log and spare_log.count("rank pid ") == 2, spare_log
    assert all(f"rank pid {pid} forked" in spare_log for pid in rank0), (rank0, spare_log)
    assert "warm spare not used" not in (jd / "logs" / "torchrun.log").read_text()


def test_each_rank_makes_its_forks_wait_for_quiet_where_python_needs_it(two_ranks: tuple[Path, Path]) -> None:
    """On Python 3.11.0-3.11.9 (this machine's 3.11.7) every rank registers the fork guard once its process group
    exists (musubi/worker/fork_guard.py); on a Python with the fix none does."""
    _, jd = two_ranks
    logs = [(jd / "logs" / f"rank{r}.log").read_text() for r in (0, 1)]
    assert all(("forks wait for a quiet rank" in log) is fork_needs_quiet() for log in logs), logs[0][-2000:]


def test_fsdp_matches_ddp(two_ranks: tuple[Path, Path], tmp_path: Path) -> None:
    """FSDP2 (fully_shard) on 2 gloo ranks: the same weights as the module's DDP run. FSDP2's stop/resume, bitwise,
    is the resume matrix's (tests/checkpoint/resume_matrix/test_resume_fsdp.py: a GPT with accumulation, every
    tensor of every checkpoint compared, DTensor shards gathered), which this file's MLP once repeated.

    No loader worker under FSDP2: the batches are the same, and the resume matrix forks loader workers beside
    FSDP2 already (musubi/worker/fork_guard.py says what a fork must not meet)."""
    job, ddp_dir = two_ranks
    fsdp = ["--set", "train.strategy=fsdp", "--set", "data.workers=0"]
    code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / "fsdp"), *fsdp)
    assert code == 0, out
    assert "strategy fsdp" in (tmp_path / "fsdp" / "tiny" / "logs" / "rank0.log").read_text()
    ddp, fsdp_state = final_state(ddp_dir), final_state(tmp_path / "fsdp" / "tiny")
    model_keys = [k for k in ddp if k.startswith("model.")]
    assert model_keys
    for k in model_keys:
        torch.testing.assert_close(fsdp_state[k], ddp[k], rtol=1e-5, atol=1e-6, msg=k)
