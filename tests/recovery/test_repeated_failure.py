"""The same cause after a restart is a defect: named in goodput, job.json, the fleet and the checklist; restarts stop."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from musubi.cli import app
from musubi.contract.inject import InjectedCrash, Injector
from musubi.fleet.jobs import absorb_job_record, failure_cause
from musubi.fleet.local import JobState
from musubi.records.checklist import build_checklist
from musubi.recovery.goodput import compute_goodput, goodput_line, repeated_failure
from musubi.recovery.repeats import exception_site
from tests.conftest import TINY_JOB

SAVER = "musubi/checkpoint/saver.py:212 in save"


def _attempts(job: Path, exits: dict[str, dict], finished: str | None = None) -> None:
    """Progress of attempts 1.0, 1.1, ... (5 steps each from 0) and each failed attempt's rank-0 exit record."""
    t = time.time()
    for d in ("progress", "heartbeat", "logs/exits"):
        (job / d).mkdir(parents=True, exist_ok=True)
    names = [*exits, *([finished] if finished else [])]
    for i, a in enumerate(names):
        t0 = t + 10 * i
        lines = [{"event": "start", "t": t0}, {"event": "train_start", "t": t0 + 1, "step": 0},
                 *[{"t": t0 + 1 + s, "step": s} for s in range(1, 6)]]
        if a == finished:
            lines.append({"event": "end", "t": t0 + 7, "step": 5})
        (job / "progress" / f"a{a}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        (job / "heartbeat" / f"a{a}-rank0.json").write_text(json.dumps({"rank": 0, "pid": 100 + i, "attempt": a,
                                                                         "time": t0 + 6.5}))
    for a, rec in exits.items():
        (job / "logs" / "exits" / f"a{a}-rank0.json").write_text(json.dumps({"rank": 0, **rec}))


def _keyerror(at: int) -> dict:
    # The torch 2.11 crash of issue 17: the same exception, at the same line, after every restart (step differs).
    return {"kind": "KeyError", "message": f"KeyError: <class 'type'> (step {at})",
            "site": "copy.py:151 in deepcopy", "ours": SAVER}


def test_the_same_exception_at_the_same_line_twice_is_a_defect(tmp_path: Path) -> None:
    _attempts(tmp_path, {"1.0": _keyerror(4), "1.1": _keyerror(8)}, finished="1.2")
    g = compute_goodput(tmp_path)
    first, second = g["failures"]
    assert "repeat_of" not in first and second["repeat_of"] == "1.0"
    assert g["defect"]["attempts"] == ["1.0", "1.1"] and g["defect"]["after_restart"] == 1
    assert "KeyError: <class 'type'>" in g["defect"]["cause"] and SAVER in g["defect"]["cause"]
    # What a third attempt sees before it trains: the two before it failed the same way.
    assert repeated_failure(tmp_path, 1, 2)["attempts"] == ["1.0", "1.1"]
    assert repeated_failure(tmp_path, 1, 1) is None
    assert goodput_line(g).endswith("; a defect: the same failure struck attempts 1.0, 1.1")


@pytest.mark.parametrize("other", [
    {**_keyerror(8), "ours": "musubi/worker/loop.py:300 in fit"},  # another line: another cause
    {"kind": "oom", "message": "out of memory in forward", "site": "x.py:1 in f", "ours": SAVER},  # its own fallback
    {"kind": "DistNetworkError", "message": "Connection reset", "site": "x.py:1 in f", "ours": SAVER},  # network
])
def test_other_or_transient_causes_are_no_defect(tmp_path: Path, other: dict) -> None:
    first = other if other["kind"] != "KeyError" else _keyerror(4)
    _attempts(tmp_path, {"1.0": first, "1.1": other}, finished="1.2")
    g = compute_goodput(tmp_path)
    assert g["defect"] is None and not any("repeat_of" in f for f in g["failures"])


def test_a_defect_is_a_failure_in_the_checklist_and_the_fleet_even_if_the_job_finished(tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = run / "a"
    _attempts(job, {"1.0": _keyerror(4), "1.1": _keyerror(8)}, finished="1.2")
    g = compute_goodput(job)
    (job / "goodput.json").write_text(json.dumps(g))
    failures = g["failures"]
    line = "job a: the same failure (...) struck again after restart 1"
    (job / "job.json").write_text(json.dumps({"config": {}, "status": "done", "nproc": 1, "device": "cpu",
                                              "history": [{"started": 0, "status": "done", "failures": failures,
                                                           "defect": line}]}))
    items = {(i.job, i.check): i for i in build_checklist(run).items}
    assert items[("a", "restarts")].status == "FAIL"
    assert items[("a", "restarts")].found.startswith("a defect, not a transient fault: the same failure (error")
    st = JobState("a", "task")
    suffix = absorb_job_record(st, job, failed=False)
    assert not any(f["recovered"] for f in st.failures) and st.causes == [f"defect: {line}"], st
    assert suffix == f"; but {line}"
    assert failure_cause(job, 1) == f"defect: {line}"  # a launch that failed of it: the fleet does not retry


def test_crash_fault_raises_at_its_step_after_every_restart_and_names_its_line(tmp_path: Path) -> None:
    inj = Injector("crash:rank=0,step=3,every=100", 0, tmp_path)
    inj.after_step(2, 0.0)
    for _ in range(2):  # every=N: no once-per-run marker, it strikes again when the step comes again
        with pytest.raises(InjectedCrash) as err:
            inj.after_step(3, 0.0)
    site = exception_site(err.value)
    assert site["ours"].startswith("musubi/contract/inject.py:") and site["site"] == site["ours"]
    assert not Injector("crash:rank=1,step=3", 0, tmp_path)  # another rank's fault


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_crash_after_every_restart_fails_the_fleet_job_with_its_cause_and_stops_restarting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2 gloo CPU ranks: rank 1 raises after step 3 of every attempt. Attempts 1.0 and 1.1 fail the same way,
    1.2 stops (no training) and 1.3 exits at once; the fleet does not retry the job."""
    monkeypatch.setenv("MUSUBI_INJECT", "crash:rank=1,step=3,every=100")
    job = {k: v for k, v in TINY_JOB.items() if k != "name"}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "rep", "defaults": {**job, "train": {**job["train"], "max_restarts": 3}},
                                     "jobs": [{"name": "tiny", "gpus": 2, "retries": 2}]}))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(fleet), "--out", str(out), "--device", "cpu", "--cpu-slots", "2",
                                   "--no-check"])
    assert res.exit_code == 1, res.output
    jd = out / "tiny"
    good = json.loads((jd / "goodput.json").read_text())
    assert good["defect"]["attempts"] == ["1.0", "1.1"] and good["attempts"] == 2, good  # 1.2 did not train
    assert "InjectedCrash" in good["defect"]["cause"] and "musubi/contract/inject.py" in good["defect"]["cause"]
    entry = json.loads((jd / "job.json").read_text())["history"][-1]
    assert entry["status"] == "failed" and entry["error"] == entry["defect"], entry
    assert entry["defect"].startswith("job tiny: the same failure (error (rank 1): rank 1: InjectedCrash: injected "
                                      "crash after step 3") and "struck again after restart 1" in entry["defect"]
    assert entry["failures"][1]["repeat_of"] == "1.0"
    state = json.loads((out / "fleet.json").read_text())["jobs"]["tiny"]
    assert state["state"] == "failed" and state["attempts"] == 1, state  # a defect is not retried
    assert state["causes"] == [f"defect: {entry['defect']}"] and not any(f["recovered"] for f in state["failures"])
    checks = {(i["job"], i["check"]): i for i in json.loads((out / "checklist.json").read_text())["items"]}
    assert checks[("tiny", "restarts")]["status"] == "FAIL" and "a defect" in checks[("tiny", "restarts")]["found"]
    # Said while it happened: rank 0's line when attempt 1.2 found the repeat, and the fleet's failed line.
    assert "struck again after restart 1" in (jd / "logs" / "rank0.log").read_text()
    assert f"failed tiny (attempt 1): defect: {entry['defect'][:60]}" in " ".join(res.output.split()), res.output
