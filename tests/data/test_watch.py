"""`musubi data watch`: a new settled version starts the fleet once; an unchanged one does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from musubi.data.watch import StartFailed, WatchState, settled_version, watch

from .sets import small_set


def test_new_versions_start_once_and_survive_a_restart(tmp_path: Path) -> None:
    small_set(tmp_path / "export")
    state = WatchState(tmp_path / "runs" / "watch-demo.json")
    store = tmp_path / "runs" / "musubi.db"
    started: list[str] = []

    def poll() -> list[str]:
        return watch(tmp_path / "export", state, store, started.append, interval_s=0, once=True, settle_s=0,
                     say=lambda _: None)

    first = poll()
    assert len(first) == 1 and started == first
    assert poll() == [] and len(started) == 1  # unchanged: nothing started, also for a new watcher
    assert WatchState(state.path).last() == first[0]
    (tmp_path / "export" / "images" / "frame_00000.jpg").write_bytes(b"new export")
    second = poll()
    assert len(second) == 1 and second[0] != first[0] and started == first + second


def test_a_changing_export_is_waited_for(tmp_path: Path) -> None:
    small_set(tmp_path / "export")
    writes = iter(range(3))

    def sleep(_: float) -> None:  # an export still being written: two more files appear between hashes
        n = next(writes, None)
        if n is not None and n < 2:
            ann = tmp_path / "export" / "annotations.json"  # the annotation file is rewritten twice
            ann.write_text(ann.read_text() + " " * (n + 1))

    v = settled_version(tmp_path / "export", tmp_path / "musubi.db", 1.0, sleep)
    assert (tmp_path / "export" / "annotations.json").read_text().endswith("  ")
    from musubi.data.version import hash_dataset

    assert v == hash_dataset(tmp_path / "export").version


def test_max_polls_bounds_the_loop(tmp_path: Path) -> None:
    small_set(tmp_path / "export")
    naps: list[float] = []
    out = watch(tmp_path / "export", WatchState(tmp_path / "w.json"), tmp_path / "db", lambda v: None,
                interval_s=5, once=False, settle_s=0, max_polls=3, sleep=naps.append, say=lambda _: None)
    assert len(out) == 1 and naps.count(5) == 2


def test_files_vanishing_while_hashing_are_retried_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: a temp file deleted between listing and hashing killed the watcher (exit 2 or a traceback).
    import musubi.data.version as version

    small_set(tmp_path / "export")
    real = version.digests
    calls = {"n": 0}

    def flaky(paths, store=None, workers=None):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] <= 2:
            raise FileNotFoundError(2, "No such file or directory", str(paths[0]))
        return real(paths, store, workers)

    monkeypatch.setattr(version, "digests", flaky)
    v = settled_version(tmp_path / "export", tmp_path / "db", 0.0, lambda _: None)
    assert v == version.hash_dataset(tmp_path / "export").version and calls["n"] >= 4


def test_a_fleet_that_did_not_start_is_tried_again(tmp_path: Path) -> None:
    # Before: the version was recorded even when the fleet did not start, so it was never trained.
    small_set(tmp_path / "export")
    state = WatchState(tmp_path / "runs" / "watch-demo.json")
    tries: list[str] = []

    def no_gpu(v: str) -> None:
        tries.append(v)
        raise StartFailed("no free GPU")

    def poll(start) -> list[str]:  # type: ignore[no-untyped-def]
        return watch(tmp_path / "export", state, tmp_path / "db", start, interval_s=0, once=True, settle_s=0,
                     say=lambda _: None)

    assert poll(no_gpu) == [] and state.last() is None
    assert poll(no_gpu) == [] and len(tries) == 2  # not "unchanged": tried again
    done = poll(lambda v: None)
    assert done == tries[:1] and state.last() == tries[0]


@pytest.mark.slow
def test_cli_once_starts_a_real_fleet_then_waits_for_new_data(tmp_path: Path) -> None:
    import json

    import yaml
    from typer.testing import CliRunner

    from musubi.cli import app

    small_set(tmp_path / "export")
    (tmp_path / "ext.py").write_text(
        "import json, os, pathlib\n"
        "d = pathlib.Path(os.environ['MUSUBI_JOB_DIR'])\n"
        "(d / 'eval.json').write_text(json.dumps({'metrics': {'top1': 0.5}, 'primary_metric': 'top1'}))\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "wf", "jobs": [{"name": "ext", "command": ["ext.py"]}],
                                     "leaderboard": {"export_top": 0}}))
    args = ["data", "watch", str(tmp_path / "export"), "--fleet", str(fleet), "--once", "--settle", "0",
            "--runs", str(tmp_path / "runs"), "--device", "cpu", "--cpu-slots", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1 and (runs[0] / "ext" / "eval.json").is_file()
    env = json.loads((runs[0] / "env.json").read_text())
    assert "datasets" in env and env["trigger"]["data_dir"] == str(tmp_path / "export")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and "unchanged" in res.output
    assert len([p for p in (tmp_path / "runs").iterdir() if p.is_dir()]) == 1
    missing = CliRunner().invoke(app, ["data", "watch", str(tmp_path / "nope"), "--fleet", str(fleet), "--once"])
    assert missing.exit_code == 2 and "not a folder" in missing.output


def test_watch_warns_when_no_job_reads_the_folder(tmp_path: Path) -> None:
    import yaml

    from musubi.cli.data import reads_from
    from musubi.config.load import load_fleet

    small_set(tmp_path / "export")
    fleet = tmp_path / "fleet.yaml"
    job = {"name": "d", "task": "detection", "model": "fcos_resnet50_fpn",
           "data": {"train": {"path": "export/images", "annotations": "export/annotations.json"}}}
    fleet.write_text(yaml.safe_dump({"name": "wf", "jobs": [job]}))
    spec = load_fleet(fleet)
    assert reads_from(spec, tmp_path / "export", tmp_path)
    (tmp_path / "other").mkdir()
    assert not reads_from(spec, tmp_path / "other", tmp_path)
