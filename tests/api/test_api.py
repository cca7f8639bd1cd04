"""The Python API (`musubi.train`, `musubi.run`): cheap to import, and a real 2-rank CPU training through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import musubi
from musubi.api import _flatten
from musubi.contract.errors import ConfigError
from tests.recipes.floors import FLOORS

REPO = Path(__file__).resolve().parents[2]


def test_import_musubi_stays_cheap_and_exposes_the_api() -> None:
    """`import musubi` loads neither torch nor the API; the first `musubi.train` loads the API, still without torch
    (the launcher on CPU needs none, and a Python caller should not pay its import before a launch)."""
    code = ("import sys, musubi; assert 'torch' not in sys.modules and 'musubi.api' not in sys.modules; "
            "f = musubi.train; assert f.__module__ == 'musubi.api' and callable(musubi.run); "
            "assert 'torch' not in sys.modules, 'musubi.api imported torch'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.stdout.strip() == "ok", out.stderr
    assert {"train", "run", "RunResult", "JobOutcome"} <= set(musubi.__all__)
    with pytest.raises(AttributeError):
        musubi.nope  # noqa: B018


def test_overrides_are_the_clis_set() -> None:
    assert _flatten({"train": {"lr": 0.1, "batch": "auto"}, "data.workers": 0, "tags": ["a", "b"]}) == \
        ["train.lr=0.1", 'train.batch="auto"', "data.workers=0", 'tags=["a", "b"]']


def test_bad_input_raises_one_line_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        musubi.train(tmp_path / "missing.yaml", out=tmp_path / "run")
    with pytest.raises(ConfigError, match="train.epocs"):
        musubi.train(REPO / "examples" / "classify-synthetic.yaml", out=tmp_path / "run", train={"epocs": 1})
    with pytest.raises(ConfigError, match="needs a name"):
        musubi.train({"task": "classification"}, out=tmp_path / "run")
    with pytest.raises(ConfigError, match="no such file"):
        musubi.run(tmp_path / "fleet.yaml", out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_through_the_api_on_two_cpu_ranks(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The README's example as shipped, from Python: outcome read back from the run directory; quiet when healthy;
    it reaches its stated floor (tests/recipes/floors.py) and logs a curve of one point a step."""
    result = musubi.train(REPO / "examples" / "classify-synthetic.yaml", nproc=2, device="cpu",
                          out=tmp_path / "run")
    console = capfd.readouterr()
    assert result.ok and result.status == "done", (result.error, console.out[-3000:], console.err[-3000:])
    assert result.run_dir == tmp_path / "run" and (result.run_dir / "checklist.json").is_file()
    job = result.jobs["classify-synthetic"]
    assert set(result.metrics) >= {"top1", "val_loss"} and result.metrics == job.metrics
    assert result.last_checkpoint == job.job_dir / "checkpoints" / "step-000000020"
    assert result.best_checkpoint is not None and result.best_checkpoint.parent == job.job_dir / "checkpoints"
    assert [r["step"] for r in job.history if r.get("kind") == "val"] == [10, 20]
    # It learns: BatchNorm statistics recomputed before validation (it validated at chance, 0.094, without)
    floor = FLOORS["classify-synthetic"]
    assert result.metrics[floor.metric] >= floor.floor, result.metrics
    # log_every unset: 20 steps give a curve of 20 points (the old fixed 10 gave 2)
    assert [r["step"] for r in job.history if r.get("kind") == "train"] == list(range(1, 21))
    # The README's first example is quiet when healthy: no loader-oversubscription warning (it was said twice).
    text = console.out + console.err + (job.job_dir / "logs" / "rank0.log").read_text()
    assert "oversubscribe" not in text
    assert "lr 0.025 = 0.025 x 32/32 (linear rule, base_batch 32) for global batch 32" in text
