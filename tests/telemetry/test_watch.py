"""Rank 0's live straggler watch when a rank's record of a step is missing (a dropped telemetry record)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from musubi.telemetry import watch
from musubi.telemetry.watch import StragglerWatch
from tests.diagnose.records import write_job

pytestmark = pytest.mark.timeout(60)


def _lines(job: Path, rank: int) -> list[str]:
    return (job / "telemetry" / f"rank{rank}.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)


def _feed(src: Path, dst: Path, drop: set[tuple[int, int]], chunk: int, monkeypatch: pytest.MonkeyPatch,
          only: dict[int, int] | None = None) -> tuple[StragglerWatch, list[dict]]:
    """Append the records of `src` to `dst` `chunk` steps at a time, polling after each chunk, as live."""
    monkeypatch.setattr(watch, "POLL_S", 3600.0)  # only the test polls
    dst.mkdir(parents=True)
    lines = {r: [ln for ln in _lines(src, r) if json.loads(ln)["kind"] == "step"] for r in (0, 1)}
    w = StragglerWatch(dst, 2, 0.05)
    n = len(lines[0])
    for i in range(0, n, chunk):
        for r in (0, 1):
            with open(dst / f"rank{r}.jsonl", "a", encoding="utf-8") as f:
                for ln in lines[r][i:i + chunk]:
                    step = json.loads(ln)["step"]
                    if (r, step) not in drop and step <= (only or {}).get(r, n):
                        f.write(ln)
        w.poll()
        assert len(w._pending) <= watch.MAX_PENDING + chunk + 1  # bounded, whatever the files hold
    w.close()
    flags_file = dst / "stragglers.jsonl"
    flags = [json.loads(x) for x in flags_file.read_text().splitlines()] if flags_file.exists() else []
    return w, flags


def test_a_missing_record_skips_one_step_and_flags_later_ones(tmp_path: Path, monkeypatch) -> None:
    src = write_job(tmp_path / "src", ranks=2, steps=120, slow_rank=1, factor=1.3)
    w, flags = _feed(src, tmp_path / "live", {(1, 10)}, 7, monkeypatch)
    assert [f["rank"] for f in flags] == [1] and flags[0]["step"] <= 50
    assert w.skipped == 1 and not w._pending and w._next == 121


def test_pending_steps_are_bounded_when_a_rank_stops_writing(tmp_path: Path, monkeypatch) -> None:
    steps = watch.MAX_PENDING + 200
    src = write_job(tmp_path / "src", ranks=2, steps=steps, noise=0.0)
    w, flags = _feed(src, tmp_path / "live", set(), 50, monkeypatch, only={1: 5})
    assert not flags and len(w._pending) <= watch.MAX_PENDING + 1 and w.skipped >= 1


def test_a_flag_is_cleared_once_the_rank_is_back_under_the_bar(tmp_path: Path, monkeypatch, caplog) -> None:
    import logging

    slow = write_job(tmp_path / "slow", ranks=2, steps=60, slow_rank=1, factor=1.3)
    fine = write_job(tmp_path / "fine", ranks=2, steps=160, seed=1)
    src = tmp_path / "src"
    (src / "telemetry").mkdir(parents=True)
    for r in (0, 1):
        keep = _lines(slow, r) + [ln for ln in _lines(fine, r) if json.loads(ln)["step"] > 60]
        (src / "telemetry" / f"rank{r}.jsonl").write_text("".join(keep), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="musubi.telemetry"):
        _, flags = _feed(src, tmp_path / "live", set(), 10, monkeypatch)
    kinds = [(f["kind"], f["rank"]) for f in flags]
    assert kinds == [("straggler", 1), ("cleared", 1)], kinds
    assert 60 < flags[1]["step"] <= 60 + 20 + 10  # a window of healthy steps, then PERSIST windows
    assert any("straggler cleared: rank 1" in r.getMessage() for r in caplog.records)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("straggler: rank 1")]
    assert "in backward" in line and "x its own first window" in line  # the own-history score, live too


@pytest.mark.parametrize("every_s", [0.0, 3600.0])
def test_straggler_now_line_repeats_while_flagged_at_most_every_line_every_s(tmp_path: Path, monkeypatch, caplog,
                                                                           every_s: float) -> None:
    import logging

    monkeypatch.setattr(watch, "LINE_EVERY_S", every_s)
    src = write_job(tmp_path / "src", ranks=2, steps=120, slow_rank=1, factor=1.2)
    with caplog.at_level(logging.WARNING, logger="musubi.telemetry"):
        _, flags = _feed(src, tmp_path / "live", set(), 10, monkeypatch)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("straggler now")]
    status = [f for f in flags if f["kind"] == "status"]
    assert [f["kind"] for f in flags][0] == "straggler"
    if every_s:  # one flag line, then nothing until the interval has passed
        assert not lines and not status
        return
    # Every poll after the flag's (one a chunk of 10 steps) says it again, with the window's figures.
    assert len(lines) >= 6 and len(status) == len(lines)
    assert all("rank 1 is" in ln and "slower than the other ranks, most in backward" in ln for ln in lines)
    assert {f["rank"] for f in status} == {1} and all(f["excess"] >= 0.05 for f in status)
    assert status[-1]["step"] == 120 and status[-1]["flagged_at"] == flags[0]["step"]


def test_current_stragglers_are_the_flagged_ranks_latest_figures(tmp_path: Path) -> None:
    recs = [{"kind": "straggler", "rank": 1, "step": 29, "section": "backward", "excess": 0.10},
            {"kind": "straggler", "rank": 0, "step": 40, "section": "data", "excess": 0.08},
            {"kind": "status", "rank": 1, "step": 60, "section": "backward", "excess": 0.123},
            {"kind": "cleared", "rank": 0, "step": 70}]
    (tmp_path / watch.FLAGS_FILE).write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"kind": "sta',
                                             encoding="utf-8")  # a torn last line, as while rank 0 writes
    now = watch.current_stragglers(tmp_path)
    assert [(f["rank"], f["step"]) for f in now] == [(1, 60)]
    assert watch.describe(now) == "rank 1 backward +12.3%"
    assert watch.describe(watch.current_stragglers(tmp_path / "none")) == "-"


QUIET = {"cores": 16, "cores_cpu": 8.0}  # a pinned rank's cores, barely used (session 7's healthy runs)


@pytest.mark.parametrize(("slow", "turns_gpu_bound", "kinds"), [
    ({"util": 85.0, **QUIET}, False, [("host_lag", 1)]),  # GPU idles for its quiet host: not an alarm
    ({"util": 40.0, "cores": 16, "cores_cpu": 100.0, "proc_cpu": 50.0}, False, [("straggler", 1)]),  # CPU hog
    ({"util": 100.0, **QUIET}, False, [("straggler", 1)]),  # its GPU is the slow one
    ({"util": 85.0, **QUIET}, True, [("host_lag", 1), ("straggler", 1)]),  # host lag, then its GPU slows
])
def test_a_rank_behind_only_on_its_quiet_host_is_not_flagged(tmp_path: Path, monkeypatch, slow: dict,
                                                            turns_gpu_bound: bool, kinds: list) -> None:
    """The live watch reads the ranks' samples with the steps: a flag whose rank has its GPU less busy than the
    others' with its pinned cores quiet is held back (recorded as host_lag); contention or a busy GPU flags."""
    src = write_job(tmp_path / "src", ranks=2, steps=120, slow_rank=1, factor=1.3, gpu=True, busy=85.0,
                    cpu={0: {"util": 99.0, **QUIET}, 1: slow})
    tdir = src / "telemetry"
    samples = {r: [json.loads(x) for x in (tdir / f"sampler-rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    steps = {r: [json.loads(x) for x in _lines(src, r) if json.loads(x)["kind"] == "step"] for r in (0, 1)}
    if turns_gpu_bound:  # from step 60 on, rank 1's GPU is as busy as its peer's
        t60 = steps[1][59]["t"]
        for s in samples[1]:
            s["util"] = 100.0 if s["t"] >= t60 else s["util"]
    monkeypatch.setattr(watch, "POLL_S", 3600.0)  # only the test polls
    live = tmp_path / "live"
    live.mkdir()
    w = StragglerWatch(live, 2, 0.05)
    for i in range(0, 120, 10):  # ten steps at a time, with the samples taken until then
        t_end = steps[0][i + 9]["t"]
        for r in (0, 1):
            with open(live / f"rank{r}.jsonl", "a", encoding="utf-8") as f:
                f.writelines(json.dumps(x) + "\n" for x in steps[r][i:i + 10])
            with open(live / f"sampler-rank{r}.jsonl", "a", encoding="utf-8") as f:
                f.writelines(json.dumps(s) + "\n" for s in samples[r] if steps[0][i]["t"] <= s["t"] < t_end
                             or (i == 0 and s["t"] < t_end))
        w.poll()
    w.close()
    flags = [json.loads(x) for x in (live / watch.FLAGS_FILE).read_text().splitlines()]
    assert [(f["kind"], f["rank"]) for f in flags if f["kind"] != "status"] == kinds
    if turns_gpu_bound:
        assert flags[-1]["step"] >= 60 and watch.current_stragglers(live)[0]["rank"] == 1
    elif kinds[0][0] == "host_lag":
        assert "busy 85 % of the time against 99 %" in flags[0]["evidence"] and not watch.current_stragglers(live)


def test_a_watch_stopped_and_started_again_keeps_its_state(tmp_path: Path, monkeypatch) -> None:
    """start=False, then start / close around each half of the records (bench/telemetry_ab.py's blocks): the
    detector reads on from where it stopped and flags as a watch running all along would."""
    monkeypatch.setattr(watch, "POLL_S", 0.01)
    src = write_job(tmp_path / "src", ranks=2, steps=120, slow_rank=1, factor=1.3)
    dst = tmp_path / "live"
    dst.mkdir()
    w = StragglerWatch(dst, 2, 0.05, start=False)
    assert not hasattr(w, "_thread")  # nothing polls before start()
    lines = {r: _lines(src, r) for r in (0, 1)}
    half = len(lines[0]) // 2
    for part in (slice(0, half), slice(half, None)):
        w.start()
        for r in (0, 1):
            with open(dst / f"rank{r}.jsonl", "a", encoding="utf-8") as f:
                f.writelines(lines[r][part])
        last = json.loads(lines[0][part][-1])["step"]
        deadline = time.monotonic() + 10
        while min(w._seen) < last and time.monotonic() < deadline:  # the started thread reads them, not close()
            time.sleep(0.01)
        assert min(w._seen) == last
        w.close()
        assert not w._thread.is_alive()
    assert w._next == 121 and w.skipped == 0
    flags = [json.loads(x) for x in (dst / "stragglers.jsonl").read_text().splitlines()]
    assert [(f["kind"], f["rank"]) for f in flags if f["kind"] == "straggler"] == [("straggler", 1)]
