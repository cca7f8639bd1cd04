"""`musubi train` refuses bad input before any worker starts: one line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

from tests.cli.helpers import one_line_error, run


def test_unknown_model(tiny_job, tmp_path: Path) -> None:
    job = tiny_job(task="classification", model="resnet5O")
    code, out = run(str(job), "--out", str(tmp_path / "r"), "--device", "cpu")
    assert code == 2
    assert "resnet5" in one_line_error(out)
    assert not (tmp_path / "r").exists()


def test_missing_data_path(tiny_job, tmp_path: Path) -> None:
    job = tiny_job(task="classification", model="resnet18",
                   data={"synthetic": None, "train": {"path": str(tmp_path / "nowhere")}})
    code, out = run(str(job), "--out", str(tmp_path / "r"), "--device", "cpu")
    assert code == 2 and "nowhere" in one_line_error(out)
    assert not (tmp_path / "r").exists()


def test_bad_batch_and_unknown_key(tiny_job, tmp_path: Path) -> None:
    code, out = run(str(tiny_job()), "--set", "train.batch=0", "--out", str(tmp_path / "r"))
    assert code == 2 and "train.batch" in one_line_error(out)
    code, out = run(str(tiny_job()), "--set", "train.lr_rul=sqrt", "--out", str(tmp_path / "r"))
    assert code == 2 and "lr_rule" in one_line_error(out)


def test_world_size_must_divide_global_batch(tiny_job, tmp_path: Path) -> None:
    code, out = run(str(tiny_job(train={"global_batch": 10})), "--nproc", "4", "--oversubscribe", "--device", "cpu",
                    "--out", str(tmp_path / "r"))
    assert code == 2 and "divisible" in one_line_error(out)


def test_unknown_user_task_module(tiny_job, tmp_path: Path) -> None:
    code, out = run(str(tiny_job(task="no_such_pkg.mod:make")), "--device", "cpu", "--out", str(tmp_path / "r"))
    assert code == 2 and "no_such_pkg" in one_line_error(out)


def test_too_many_gpu_ranks_refused(tiny_job, tmp_path: Path) -> None:
    code, out = run(str(tiny_job()), "--device", "cuda", "--out", str(tmp_path / "r"))
    assert code == 2 and "GPU" in one_line_error(out)
