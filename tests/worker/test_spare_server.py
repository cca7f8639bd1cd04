"""The spare server (musubi/worker/spare_server.py) as real processes: a launch's spare forked by it has the state
of a spare the launcher started itself, a launch through it trains bit for bit as one without, and a server that is
gone, or dies under a launch, leaves the launcher to start its spare the plain way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from musubi.contract.env import MUSUBI_SPARE_SERVER
from musubi.contract.exits import EXIT_SPARE_GONE
from musubi.contract.spare_client import LOG_NAME, SOCKET_NAME
from musubi.launch.spare import ServedProcess, died, start_spare, stop_spare
from tests.conftest import write_tiny_job
from tests.support.pythonpath import repo_on_path
from tests.support.runs import bitwise_equal, final_state, train
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
PROBE = {"name": "probe", "task": "tests.support.state_probe:make"}


def ignore_usr2() -> None:
    """In the server's child before exec: SIGUSR2 ignored, which the launches below do not ignore."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, Path]]:
    """A server started unlike the launches: another folder, thread count, PYTHONPATH, inductor cache, variable and
    SIGUSR2."""
    folder = Path(tempfile.mkdtemp(prefix="musubi-zygote-test-", dir="/tmp"))
    cwd = tmp_path_factory.mktemp("server-cwd")
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(cwd), "SERVER_ONLY": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(cwd / "inductor")}
    env.pop(MUSUBI_SPARE_SERVER, None)
    with open(folder.parent / (folder.name + ".log"), "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "musubi.worker.spare_server", str(folder)], cwd=cwd, env={
            **env, "PYTHONPATH": os.pathsep.join([repo_on_path(REPO), str(cwd)])}, stdout=log, stderr=log, preexec_fn=ignore_usr2)
    assert wait_for(lambda: (folder / SOCKET_NAME).exists(), timeout=120), proc.poll()
    yield proc, folder
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)


def launch_env(probe_out: Path, server: Path | None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STATE_PROBE_OUT": str(probe_out), "LAUNCH_ONLY": "1",
           # The repository twice, as a caller's PYTHONPATH may name it: the start drops the repeat.
           "PYTHONPATH": os.pathsep.join([str(probe_out.parent), repo_on_path(REPO), str(REPO)]),
           "PYTHONUNBUFFERED": "1"}
    env.pop(MUSUBI_SPARE_SERVER, None)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # as a launcher that never imported torch: the spare's import sets it
    if server is not None:
        env[MUSUBI_SPARE_SERVER] = str(server)
    return env


def probed(spare, out: Path) -> dict:  # noqa: ANN001 - a WarmSpare
    path = out / f"{spare.proc.pid}.json"
    assert wait_for(path.exists, timeout=60), (spare.proc.poll(), (spare.folder / LOG_NAME).read_text())
    return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_served_spare_has_the_state_of_one_the_launcher_started(server, tmp_path: Path) -> None:
    proc, folder = server
    plain_out, served_out = tmp_path / "plain", tmp_path / "served"
    plain_out.mkdir()
    served_out.mkdir()
    spares = []
    try:
        spares.append(start_spare(PROBE, launch_env(plain_out, None)))
        spares.append(start_spare(PROBE, launch_env(served_out, folder)))
        plain, served = probed(spares[0], plain_out), probed(spares[1], served_out)
    finally:
        for s in spares:
            stop_spare(s)
    assert isinstance(spares[1].proc, ServedProcess) and not isinstance(spares[0].proc, ServedProcess)
    assert served["ppid"] == proc.pid and plain["ppid"] == os.getpid(), (served["ppid"], plain["ppid"])
    for s in (plain, served):  # a session of its own, as start_new_session gives
        assert s["sid"] == s["pid"] == s["pgid"], s
    # the launch's environment wholesale (no SERVER_ONLY, its PYTHONPATH), its intra-op threads (1, not the
    # server's 2), its sys.path, folder, umask, cores, signals (SIGUSR2 not ignored as in the server), fds
    for key in ("env", "threads", "sys_path", "cwd", "umask", "affinity", "signals", "blocked", "fds", "argv",
                "dont_write_bytecode"):
        p, s = plain[key], served[key]
        if key in ("argv", "fds"):  # each spare has a folder of its own; a served one is told --served
            p, s = ([x.replace(str(spare.folder), "SPARE") for x in xs] for spare, xs in zip(spares, (p, s), strict=True))
            if key == "argv":
                assert s.pop() == "--served"
        if key == "env":
            p, s = (  # the launch names its server
                {k: v for k, v in d.items() if k not in ("STATE_PROBE_OUT", MUSUBI_SPARE_SERVER)} for d in (p, s))
        assert p == s, (key, p, s)
    assert served["threads"] == 1 and "SERVER_ONLY" not in served["env"]
    assert served["signals"][str(int(signal.SIGUSR2))] == "dfl"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_launch_through_the_server_trains_bitwise_like_one_without(server, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _, folder = server
    job = write_tiny_job(tmp_path, train={"epochs": 1})
    runs = {}
    for name, via in (("served", str(folder)), ("plain", None)):
        if via is None:
            monkeypatch.delenv(MUSUBI_SPARE_SERVER, raising=False)
        else:
            monkeypatch.setenv(MUSUBI_SPARE_SERVER, via)
        code, out = train(str(job), "--nproc", "2", "--out", str(tmp_path / name), "--no-check")
        assert code == 0, out
        runs[name] = tmp_path / name / "tiny"
    served_log = (runs["served"] / "logs" / "spare.log").read_text()
    assert "warm spare ready in" in served_log and served_log.count("rank pid ") == 2, served_log
    assert "not used" not in served_log and "warm spare not used" not in (runs["served"] / "logs" / "torchrun.log").read_text()
    a, b = final_state(runs["served"]), final_state(runs["plain"])
    assert a.keys() == b.keys() and all(bitwise_equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_server_that_dies_takes_its_spare_and_later_launches_start_plain(tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="musubi-zygote-test-", dir="/tmp"))
    env = {**os.environ}
    env.pop(MUSUBI_SPARE_SERVER, None)
    proc = subprocess.Popen([sys.executable, "-m", "musubi.worker.spare_server", str(folder)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: (folder / SOCKET_NAME).exists(), timeout=120), proc.poll()
        spare = start_spare(PROBE, launch_env(tmp_path, folder))
        assert isinstance(spare.proc, ServedProcess)
        probed(spare, tmp_path)
        proc.kill()
        proc.wait(timeout=30)
        # the spare died with the server, as the agent's client would report (EXIT_SPARE_GONE): the launcher's reading
        assert died(spare, EXIT_SPARE_GONE) == "signal 9"
        stop_spare(spare)
        later = start_spare(PROBE, launch_env(tmp_path, folder))  # the socket is left, nobody listens: plain
        try:
            assert not isinstance(later.proc, ServedProcess) and later.proc.poll() is None
            probed(later, tmp_path)
        finally:
            stop_spare(later)
    finally:
        if proc.poll() is None:
            proc.kill()


LAUNCHER = """
import json, sys, time
from musubi.launch.spare import start_spare
s = start_spare({"name": "probe", "task": "tests.support.state_probe:make"}, dict(__import__("os").environ))
print(json.dumps({"pid": s.proc.pid, "served": type(s.proc).__name__}), flush=True)
time.sleep(300)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_served_spare_dies_with_its_launcher(server, tmp_path: Path) -> None:
    _, folder = server
    env = launch_env(tmp_path, folder)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        seen = json.loads(launcher.stdout.readline())  # type: ignore[union-attr]
        assert seen["served"] == "ServedProcess", seen
        spare = psutil.Process(seen["pid"])
        assert wait_for((tmp_path / f"{seen['pid']}.json").exists, timeout=60)
        launcher.kill()
        launcher.wait(timeout=30)
        spare.wait(timeout=30)  # the server saw the launcher's connection close and killed it
    finally:
        if launcher.poll() is None:
            launcher.kill()
