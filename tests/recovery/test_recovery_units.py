"""Recovery pieces without torchrun: checksums, retention, the async writer, the watchdog's verdict, goodput."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from musubi.checkpoint import checkpoint as ckpt
from musubi.checkpoint.saver import Checkpointer
from musubi.checkpoint.states import CheckpointStates, Held
from musubi.config.job import CheckpointSpec, WatchdogSpec
from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_HANG
from musubi.contract.inject import Injector, parse
from musubi.contract.world import World
from musubi.recovery.goodput import compute_goodput
from musubi.recovery.watchdog import Heartbeat, Watchdog, describe_hang

pytestmark = pytest.mark.timeout(60)


def _fake_checkpoint(root: Path, step: int, metric: float | None = None) -> Path:
    d = ckpt.step_dir(root, step)
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(bytes(range(256)) * 4)
    (d / ".metadata").write_bytes(b"meta")
    ckpt.commit(d, step, {"step": step}, 1, {"acc": metric} if metric is not None else None)
    return d


def test_checksum_mismatch_falls_back_with_a_warning_naming_it(tmp_path: Path, caplog) -> None:
    root = tmp_path / "checkpoints"
    _fake_checkpoint(root, 3)
    bad = _fake_checkpoint(root, 6)
    shard = bad / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))
    assert ckpt.latest_checkpoint(root).step == 6  # sizes alone cannot see it
    with caplog.at_level(logging.WARNING, logger="musubi.checkpoint"):
        assert ckpt.latest_checkpoint(root, checksums=True).step == 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(bad) in lines[0] and "checksum" in lines[0]
    # a missing shard and a missing marker are skipped the same way
    (bad / "__0_0.distcp").unlink()
    _fake_checkpoint(root, 9)
    (ckpt.step_dir(root, 9) / ckpt.MARKER).unlink()
    assert ckpt.latest_checkpoint(root, checksums=True).step == 3


def test_retention_keeps_last_and_best(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step, acc in [(1, 0.5), (2, 0.9), (3, 0.6), (4, 0.7), (5, 0.4)]:
        _fake_checkpoint(root, step, acc)
    (ckpt.step_dir(root, 0)).mkdir()  # an unfinished older save
    ckpt.retain(root, keep_last=2, keep_best=1, best_metric="acc", best_mode="max")
    assert sorted(d.name for d in root.iterdir()) == ["step-000000002", "step-000000004", "step-000000005"]
    ckpt.retain(root, keep_last=1, keep_best=1, best_metric="acc", best_mode="min")
    assert sorted(d.name for d in root.iterdir()) == ["step-000000005"]


@pytest.mark.parametrize("mode", [
    "thread", "off",
    # DCP's checkpoint daemon: a spawned process with a process group of its own.
    pytest.param("process", marks=pytest.mark.timeout(180)),
])
def test_save_commits_when_durable_and_records_timings(tmp_path: Path, mode: str) -> None:
    if mode == "process":  # DCP's daemon takes its ranks from the default group, as under torchrun
        dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        _save_and_check(tmp_path, mode)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _save_and_check(tmp_path: Path, mode: str) -> None:
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    states = CheckpointStates(model, opt, train=Held({"step": 4, "signature": "x"}),
                              rank=Held({"seed": torch.tensor([1])}), signature="x")
    saver = Checkpointer(tmp_path / "checkpoints", CheckpointSpec(async_mode=mode), world,
                         Injector(None, 0, None), states, "acc")
    saver.save(4, {"acc": 0.5})
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():  # training moves on while the save is in flight: the checkpoint must not see it
        for p in model.parameters():
            p.add_(1.0)
    saver.wait()
    found = ckpt.latest_checkpoint(tmp_path / "checkpoints", checksums=True)
    assert found is not None and found.step == 4 and found.marker["metric"] == {"acc": 0.5}
    assert set(found.marker["sha256"]) == set(found.marker["files"])
    full = ckpt.read_full_state(found.path)
    for k, v in expected.items():
        assert torch.equal(full["model"][k], v), k
    (rec,) = saver.drain()
    assert rec["ok"] and rec["mode"] == {"off": "sync"}.get(mode, mode) and 0 <= rec["blocked_s"] <= rec["durable_s"]
    saver.close()


def test_drill_refuses_bad_input_in_one_line(tiny_job, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from musubi.cli import app

    res = CliRunner().invoke(app, ["drill", str(tiny_job()), "--faults", "kill,meteor", "--out", str(tmp_path / "d")])
    assert res.exit_code == 2 and "--faults" in res.output and "kill, hang, ckpt_kill" in res.output
    res = CliRunner().invoke(app, ["drill", str(tiny_job()), "--repeat", "0", "--out", str(tmp_path / "d")])
    assert res.exit_code == 2 and "--repeat 0" in res.output
    assert not (tmp_path / "d").exists()


def test_async_mode_and_inject_grammar() -> None:
    assert parse("ckpt_kill:step=3,phase=write")[0].params["phase"] == "write"
    assert parse("ckpt_kill:step=3")[0].params["phase"] == "commit"
    with pytest.raises(ConfigError, match="phase must be one of write, commit"):
        parse("ckpt_kill:step=3,phase=forward")
    assert parse("hang:rank=1,step=8")[0].kind == "hang"


def _watchdog(tmp_path: Path, exits: list[int]) -> tuple[Watchdog, Heartbeat]:
    hb = Heartbeat()
    wd = Watchdog(tmp_path, 0, 2, WatchdogSpec(floor_s=2, factor=10), 600.0, hb, exit_fn=exits.append)
    return wd, hb


def test_watchdog_timeout_follows_step_times_with_a_floor(tmp_path: Path) -> None:
    wd, hb = _watchdog(tmp_path, [])
    assert wd.timeout_for("forward") == 2
    hb.step_times.extend([0.1, 0.5])
    assert wd.timeout_for("backward") == pytest.approx(5.0)
    assert wd.timeout_for("eval") == 600.0  # long phases get the collective timeout


def test_watchdog_names_the_rank_that_stopped(tmp_path: Path) -> None:
    exits: list[int] = []
    wd, hb = _watchdog(tmp_path, exits)
    peer = wd.dir / f"a{wd.attempt}-rank1.json"
    # rank 1 finished step 7 and stopped; rank 0 went on into step 8's backward and waits there
    peer.write_text(json.dumps({"rank": 1, "step": 7, "phase": "between steps", "seq": 30, "pid": 0}))
    hb.step, hb.seq, hb.phase = 7, 32, "backward"
    assert wd.check(100.0) is None
    assert wd.check(101.5) is None  # 1.5 s < 2 s floor
    states = wd.check(102.5)
    assert states is not None
    report = describe_hang(states, wd.attempt)
    assert report["culprits"] == [1] and report["waiting"] == [0] and "gradient all-reduce" in report["message"]
    wd.on_hang(states)
    assert exits == [EXIT_HANG]
    saved = json.loads((tmp_path / "logs" / "hang" / f"hang-a{wd.attempt}.json").read_text())
    assert saved["culprits"] == [1]
    assert "test_watchdog_names_the_rank_that_stopped" in wd.stacks.read_text()


def test_goodput_from_a_killed_attempt(tmp_path: Path) -> None:
    t = time.time()
    (tmp_path / "progress").mkdir()
    (tmp_path / "heartbeat").mkdir()
    (tmp_path / "logs" / "exits").mkdir(parents=True)

    def progress(name: str, lines: list[dict]) -> None:
        (tmp_path / "progress" / f"a{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    # attempt 1.0: steps 1..7 at 1 s each, then rank 1 died; attempt 1.1 resumed from 4 and finished at 10
    progress("1.0", [{"event": "start", "t": t}, {"event": "train_start", "t": t + 5, "step": 0},
                     *[{"t": t + 5 + s, "step": s} for s in range(1, 8)]])
    progress("1.1", [{"event": "start", "t": t + 14}, {"event": "train_start", "t": t + 20, "step": 4},
                     *[{"t": t + 20 + s - 4, "step": s} for s in range(5, 11)],
                     {"event": "end", "t": t + 26.5, "step": 10}])
    for r in (0, 1):
        (tmp_path / "heartbeat" / f"a1.0-rank{r}.json").write_text(
            json.dumps({"rank": r, "pid": 10 + r, "attempt": "1.0", "time": t + 12.5}))
    (tmp_path / "logs" / "exits" / "a1.0-rank0.json").write_text(
        json.dumps({"rank": 0, "kind": "RuntimeError", "message": "Connection closed by peer [127.0.0.1]:1"}))
    (tmp_path / "job.json").write_text(json.dumps({"history": [{"started": t - 1, "ended": t + 27}]}))
    g = compute_goodput(tmp_path)
    (f,) = g["failures"]
    assert (f["failed_at_step"], f["resumed_from_step"], f["lost_steps"]) == (7, 4, 3)
    assert f["cause"] == "rank died" and f["ranks"] == [1]
    assert f["lost_s"] == pytest.approx(12.5 - 9) and f["downtime_s"] == pytest.approx(20 - 12.5)
    # productive: 4 s (steps 1-4) + 6 s (steps 5-10) of 28 s wall
    assert g["productive_s"] == pytest.approx(10.0, abs=0.01) and g["goodput"] == pytest.approx(10 / 28, abs=1e-3)


def test_a_hang_waits_for_live_peers_stacks_not_for_a_stopped_one(tmp_path: Path) -> None:
    """The peers' stacks are asked for (SIGUSR1) and waited for until written; a stopped culprit is not waited for
    (it cannot answer: the fixed 0.5 s wait this replaced was a hang's whole detection-to-exit time)."""
    import signal
    import subprocess
    import sys

    exits: list[int] = []
    hb = Heartbeat()
    wd = Watchdog(tmp_path, 0, 3, WatchdogSpec(floor_s=2, factor=10), 600.0, hb, exit_fn=exits.append)
    wd.start()
    wd.stop()  # its files exist; no thread judges in the background
    peers = []
    for r in (1, 2):  # rank 1 answers, rank 2 is stopped
        code = ("import faulthandler, signal, sys, time; "
                f"f = open({str(wd.hang_dir / f'stacks-a{wd.attempt}-rank{r}.txt')!r}, 'a'); "
                "faulthandler.register(signal.SIGUSR1, file=f, all_threads=True); print('ready', flush=True); "
                "time.sleep(60)")
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        peers.append(p)
    try:
        peers[1].send_signal(signal.SIGSTOP)
        import psutil

        deadline = time.monotonic() + 10
        while psutil.Process(peers[1].pid).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.01)  # the stop is delivered asynchronously
        hb.step, hb.seq, hb.phase = 7, 32, "backward"
        base = {"step": 7, "phase": "between steps", "seq": 30, "host": wd.host, "stalled_s": 9, "timeout_s": 2}
        states = {0: {"rank": 0, "step": 7, "phase": "backward", "seq": 32, "host": wd.host, "pid": wd.pid,
                      "stalled_s": 0, "timeout_s": 2},
                  2: {**base, "rank": 2, "pid": peers[1].pid}}
        t = time.monotonic()
        wd.on_hang(states)  # only the stopped culprit on this host: nothing to wait for
        assert time.monotonic() - t < 0.4 and exits == [EXIT_HANG]
        states[1] = {**base, "rank": 1, "pid": peers[0].pid}
        wd.on_hang(states)
        assert "most recent call first" in (wd.hang_dir / f"stacks-a{wd.attempt}-rank1.txt").read_text()
    finally:
        for p in peers:
            p.kill()
            p.wait()


def test_goodput_names_a_nan_exit_and_a_signal(tmp_path: Path) -> None:
    """A NaN's exit (76) is named numerics, not a hang (the hang's code was 76 too); a signal by its name."""
    t = time.time()
    for d in ("progress", "heartbeat", "logs/exits"):
        (tmp_path / d).mkdir(parents=True)
    for name, t0, resumed in (("1.0", t, 0), ("1.1", t + 10, 0), ("1.2", t + 20, 0)):
        (tmp_path / "progress" / f"a{name}.jsonl").write_text(
            json.dumps({"event": "start", "t": t0}) + "\n" + json.dumps({"event": "train_start", "t": t0 + 1,
                                                                        "step": resumed}) + "\n"
            + json.dumps({"t": t0 + 2, "step": 3}) + "\n"
            + (json.dumps({"event": "end", "t": t0 + 3, "step": 3}) + "\n" if name == "1.2" else ""))
        for r in (0, 1):
            (tmp_path / "heartbeat" / f"a{name}-rank{r}.json").write_text(
                json.dumps({"rank": r, "pid": int(t0) % 1000 * 10 + r, "attempt": name, "time": t0 + 3}))
    for r in (0, 1):
        (tmp_path / "logs" / "exits" / f"a1.0-rank{r}.json").write_text(json.dumps(
            {"rank": r, "kind": "numerics", "message": "loss is nan at step 3 in bf16: rolling back"}))
    pid = int(t + 10) % 1000 * 10 + 1
    (tmp_path / "logs" / "torchrun.log").write_text(f"failed (exitcode: -9) local_rank: 1 (pid: {pid})\n")
    (tmp_path / "job.json").write_text(json.dumps({"history": [{"started": t - 1, "ended": t + 25}]}))
    first, second = compute_goodput(tmp_path)["failures"]
    assert first["cause"] == "numerics" and first["ranks"] == [0, 1], first
    assert second["cause"] == "killed" and "killed by SIGKILL (torchrun)" in second["detail"], second


def test_step_times_exclude_eval_and_checkpoint_and_eval_gets_its_own_timeout(tmp_path: Path) -> None:
    """A step is timed from its first forward: a long evaluation before it does not inflate the hang
    timeout; evaluation's own timeout follows its last duration, below the collective timeout."""
    wd, hb = _watchdog(tmp_path, [])
    for _ in range(2):
        hb.beat("forward")
        time.sleep(0.02)
        hb.stepped(hb.step + 1)
        hb.beat("between steps")
    hb.beat("eval")
    time.sleep(0.3)
    hb.beat("checkpoint")
    time.sleep(0.1)
    hb.beat("forward")
    time.sleep(0.02)
    hb.stepped(hb.step + 1)
    assert max(hb.step_times) < 0.2, list(hb.step_times)
    assert wd.timeout_for("backward") == 2  # the floor, not 10 x (eval + checkpoint)
    assert 0.3 <= hb.phase_times["eval"] < 0.5
    assert wd.timeout_for("eval") == pytest.approx(max(2, 10 * hb.phase_times["eval"]))
    assert wd.timeout_for("checkpoint") == 600.0  # may wait for the previous save: the collective timeout


def test_flight_recorder_names_the_collective_that_never_completed(tmp_path: Path) -> None:
    """gloo's recorder: finished entries are `retired`, the pending one is not (the shape torch 2.x dumps)."""
    from musubi.recovery.watchdog import pending_collectives

    def entry(name: str, seq: int, pg: int, retired: bool) -> dict:
        return {"profiling_name": name, "collective_seq_id": seq, "pg_id": pg, "input_sizes": [[676]],
                "state": "scheduled", "retired": retired}

    dump = tmp_path / "fr.json"
    dump.write_text(json.dumps({"version": "2.7", "entries": [
        entry("gloo:all_reduce", 18, 0, True), entry("gloo:all_reduce", 19, 0, False),
        entry("gloo:broadcast", 18, 1, True)]}))
    assert pending_collectives(dump) == [{"profiling_name": "gloo:all_reduce", "pg_id": 0, "collective_seq_id": 19,
                                          "input_sizes": [[676]], "state": "scheduled"}]
    assert pending_collectives(tmp_path / "missing.json") == []


def test_a_recorded_checkpoint_daemon_is_reaped_and_a_reused_pid_is_not(tmp_path: Path) -> None:
    """The record a rank writes for DCP's daemon is what the reaper reads: the recorded process is ended;
    a record whose start time is not the live process's (its pid reused) leaves that process alone."""
    import subprocess
    import sys

    import psutil

    from musubi.checkpoint.daemons import reap_checkpoint_daemons, record_daemon

    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record_daemon(tmp_path, "1.0", 0, daemon.pid, psutil.Process(daemon.pid).create_time())
        record_daemon(tmp_path, "1.0", 1, bystander.pid, psutil.Process(bystander.pid).create_time() - 100)
        assert reap_checkpoint_daemons(tmp_path, skip_attempt="2.0") == [daemon.pid]
        assert daemon.wait(timeout=10) != 0 and bystander.poll() is None
        assert not list((tmp_path / "heartbeat").glob("*.json"))  # both records consumed
    finally:
        for p in (daemon, bystander):
            p.kill()
            p.wait()
