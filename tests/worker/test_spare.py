"""The warm spare and its thin client as real processes on a tiny entry (tests/support/spare_entry.py).

One spare (no torch: `--warm ""`) serves the module's clients; a client is what torchrun would start per rank.
A rank forked by the spare must be indistinguishable to torchrun from one started the plain way: its output on
the client's fds, its exit code or its death by signal mirrored by the client, signals forwarded, and the rank
gone when the client is SIGKILLed; with no ready spare the client runs the plain `python -m` entry.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from musubi.contract import spare_client
from musubi.contract.env import MUSUBI_WARM_SPARE
from musubi.launch.launch import torchrun_argv
from musubi.launch.spare import WarmSpare, client_command, stop_spare, wanted

REPO = Path(__file__).resolve().parents[2]
ENTRY = "tests.support.spare_entry"


def start(folder: Path, **env: str) -> subprocess.Popen:
    """A spare serving ENTRY from `folder`, importing nothing heavy."""
    return subprocess.Popen([sys.executable, "-m", "musubi.worker.spare", str(folder), str(folder), str(os.getpid()),
                             "--entry", ENTRY, "--warm", ""], cwd=REPO, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def client(folder: Path, *args: str, ready_s: float = 30.0, **env: str) -> subprocess.Popen:
    """What torchrun starts for one rank (launch/spare.py client_command, minus torchrun's --no-python)."""
    argv = client_command(WarmSpare(None, folder), ready_s, ENTRY)[1:]  # type: ignore[arg-type]
    return subprocess.Popen([*argv, *args], cwd=REPO, env={**os.environ, "SPARE_PROBE": "from-client", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(pred, timeout: float = 20.0) -> bool:  # noqa: ANN001 - a no-argument predicate
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture(scope="module")
def spare() -> Iterator[tuple[subprocess.Popen, Path]]:
    folder = Path(tempfile.mkdtemp(prefix="musubi-spare-test-"))
    proc = start(folder)
    assert wait_for(lambda: (folder / spare_client.SOCKET_NAME).exists()), "the spare never listened"
    yield proc, folder
    stop_spare(WarmSpare(proc, folder))
    assert proc.returncode == 0, proc.stdout.read() if proc.stdout else ""


def test_a_forked_rank_has_the_clients_fds_env_and_cwd_and_its_exit_code(spare) -> None:
    proc, folder = spare
    for code in (0, 3):
        c = client(folder, "info", str(code))
        out, err = c.communicate(timeout=30)
        assert c.returncode == code, (out, err)
        seen = json.loads(out.splitlines()[-1])
        assert seen["forked"] and seen["ppid"] == proc.pid and seen["pid"] != c.pid, seen
        assert seen["sid"] == seen["pid"], "a rank leads a session of its own, as torchrun's workers do"
        assert seen["cwd"] == str(REPO) and seen["probe"] == "from-client" and seen["argv"] == ["info", str(code)]
        assert seen["sys_argv"] == ["info", str(code)] and seen["started"] <= time.time()
        assert "rank stderr line" in err and "warm spare not used" not in err


def test_a_rank_killed_by_a_signal_ends_its_client_by_the_same_signal(spare) -> None:
    _, folder = spare
    c = client(folder, "signal", "SIGUSR1")
    c.communicate(timeout=30)
    assert c.returncode == -signal.SIGUSR1


def test_sigterm_to_the_client_reaches_the_rank(spare, tmp_path: Path) -> None:
    _, folder = spare
    pid_file = tmp_path / "pid"
    c = client(folder, "wait", str(pid_file))
    assert wait_for(pid_file.exists), "the rank never started"
    c.send_signal(signal.SIGTERM)
    out, err = c.communicate(timeout=30)
    assert c.returncode == 7 and "rank got SIGTERM" in out, (out, err)


def test_a_sigkilled_client_takes_its_rank_with_it(spare, tmp_path: Path) -> None:
    _, folder = spare
    pid_file = tmp_path / "pid"
    c = client(folder, "wait", str(pid_file))
    assert wait_for(pid_file.exists), "the rank never started"
    rank = int(pid_file.read_text())
    c.kill()
    c.communicate(timeout=30)
    # The spare kills and reaps it: no process, not even a zombie, is left under that pid.
    assert wait_for(lambda: not Path(f"/proc/{rank}").exists()), f"rank {rank} outlived its SIGKILLed client"


def test_a_spare_that_dies_takes_its_ranks_and_later_clients_start_plain(tmp_path: Path) -> None:
    """The spare killed under a running rank: the rank dies with it (PR_SET_PDEATHSIG), its client exits 1 and
    says so (torchrun restarts), and the restarted rank's client finds nobody listening and starts plain."""
    proc = start(tmp_path)
    assert wait_for(lambda: (tmp_path / spare_client.SOCKET_NAME).exists()), "the spare never listened"
    pid_file = tmp_path / "pid"
    c = client(tmp_path, "wait", str(pid_file))
    assert wait_for(pid_file.exists), "the rank never started"
    rank = int(pid_file.read_text())
    proc.kill()
    proc.wait(timeout=30)
    _, err = c.communicate(timeout=30)
    assert c.returncode == 1 and "the warm spare ended before rank" in err, err
    assert wait_for(lambda: not Path(f"/proc/{rank}").exists()), f"rank {rank} outlived its spare"
    _, err = fell_back(client(tmp_path, "info", "5"))
    assert "does not answer" in err


def fell_back(c: subprocess.Popen) -> tuple[dict, str]:
    out, err = c.communicate(timeout=60)
    assert c.returncode == 5, (out, err)
    seen = json.loads(out.splitlines()[-1])
    assert not seen["forked"] and seen["pid"] == c.pid, "the plain path execs in the client's own process"
    return seen, err


def test_no_spare_the_client_runs_the_plain_entry(tmp_path: Path) -> None:
    _, err = fell_back(client(tmp_path / "absent", "info", "5"))
    assert "warm spare not used (the warm spare's folder" in err


def test_a_spare_not_ready_in_time_the_client_runs_the_plain_entry(tmp_path: Path) -> None:
    (tmp_path / spare_client.PID_NAME).write_text(f"{os.getpid()}\n")  # alive, but never listens
    _, err = fell_back(client(tmp_path, "info", "5", ready_s=0.3))
    assert "not ready within 0.3 s" in err


def test_a_dead_spare_is_not_waited_for(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / spare_client.PID_NAME).write_text(dead.stdout)
    t0 = time.monotonic()
    _, err = fell_back(client(tmp_path, "info", "5", ready_s=30))
    assert "ended before it was ready" in err and time.monotonic() - t0 < 20


def test_a_spare_with_a_thread_alive_refuses_and_the_client_runs_the_plain_entry(tmp_path: Path) -> None:
    proc = start(tmp_path, SPARE_ENTRY_THREAD="1")
    assert proc.wait(timeout=60) == 1
    assert "threads alive" in (tmp_path / spare_client.REFUSED_NAME).read_text()
    _, err = fell_back(client(tmp_path, "info", "5"))
    assert "threads alive in the warm spare after its imports" in err


def test_only_rank_0_says_why_it_fell_back(tmp_path: Path) -> None:
    _, err = fell_back(client(tmp_path / "absent", "info", "5", RANK="1"))
    assert "warm spare not used" not in err


#: A Python another user may run (the venv's may sit in a folder only we can read); the probe needs no package.
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(os.getuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="needs root (to connect as another uid) and a system python3")
def test_a_client_of_another_uid_is_refused(spare) -> None:
    _, folder = spare
    sock = folder / spare_client.SOCKET_NAME
    folder.chmod(0o755)  # the folder's 0700 keeps others out; open it to reach the SO_PEERCRED check behind it
    sock.chmod(0o777)
    try:
        probe = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
                 "print(s.recv(4096)[4:].decode())")
        r = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", probe, str(sock)], user=65534, capture_output=True,
                           text=True, timeout=30)
    finally:
        folder.chmod(0o700)
        sock.chmod(0o600)
    assert json.loads(r.stdout) == {"refused": "the warm spare serves its own user only"}, (r.stdout, r.stderr)


def test_the_knob_and_the_variable_turn_it_off() -> None:
    assert wanted({"warm_spare": True}, {}) and wanted({}, {MUSUBI_WARM_SPARE: "1"})
    assert not wanted({"warm_spare": False}, {})
    assert not wanted({"warm_spare": True}, {MUSUBI_WARM_SPARE: "0"})


def test_a_client_without_its_arguments_says_how_and_exits_2() -> None:
    """The one end the client spells itself reads the exit-code table (EXIT_CONFIG), loaded by path."""
    r = subprocess.run([sys.executable, "-I", "-S", spare_client.__file__, "only-one"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "usage: spare_client.py SPARE_DIR READY_S MODULE --" in r.stderr, r


def test_torchrun_starts_the_client_in_place_of_the_worker_module(tmp_path: Path) -> None:
    """With a spare torchrun runs the isolated client (`--no-python`), the worker's arguments after `--`."""

    spare = WarmSpare(None, tmp_path)  # type: ignore[arg-type]
    argv = torchrun_argv(tmp_path / "job", 2, True, None, entry=client_command(spare))
    tail = argv[argv.index("--no-python"):]
    assert "-m" not in tail and tail == ["--no-python", sys.executable, "-I", "-S", spare_client.__file__,
                                         str(tmp_path), "60", "musubi.worker.worker", "--", str(tmp_path / "job"),
                                         "--resume"]
    plain = torchrun_argv(tmp_path / "job", 2, True, None)
    assert plain[-4:] == ["-m", "musubi.worker.worker", str(tmp_path / "job"), "--resume"]


def test_cuda_counts_as_initialized_by_torchs_flag_or_the_driver_files_not_by_imports(monkeypatch) -> None:
    # The 2x H200 soak (2026-11-28): the spare's imports mapped libcuda.so without initializing CUDA, and the
    # old test (the library mapped) refused the spare on every GPU run. Imports alone must not count.
    import torch
    import torchvision  # noqa: F401 - its extensions link the driver library on CUDA builds

    from musubi.worker.spare import cuda_initialized

    assert not cuda_initialized()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert cuda_initialized()


def test_a_long_tmpdir_puts_the_socket_folder_where_its_path_fits(tmp_path: Path) -> None:
    # A scheduler's per-job scratch (or a test's tmp_path) as TMPDIR made bind() fail: "AF_UNIX path too long".
    from musubi.launch.spare import MAX_SOCKET_PATH, socket_folder

    long_tmp = tmp_path / ("x" * 90)
    long_tmp.mkdir()
    folder = socket_folder({"TMPDIR": str(long_tmp)})
    try:
        assert len(str(folder / (spare_client.SOCKET_NAME + ".tmp"))) <= MAX_SOCKET_PATH
        assert folder.stat().st_mode & 0o077 == 0
    finally:
        folder.rmdir()
    short = socket_folder({"TMPDIR": str(tmp_path)}) if len(str(tmp_path)) < 60 else None
    if short is not None:
        assert short.parent == tmp_path
        short.rmdir()


def test_a_spare_that_fails_after_its_imports_is_not_waited_for(tmp_path: Path) -> None:
    # Its folder's socket path too long for bind(): the spare dies, and says so at once in refused.txt, so the
    # client falls back with the reason instead of waiting out its READY_S (the dead spare is a zombie of its
    # launcher until reaped, which a signal 0 finds alive).
    folder = tmp_path / ("y" * 110)
    folder.mkdir()
    proc = start(folder)
    assert proc.wait(timeout=60) != 0
    assert "AF_UNIX path too long" in (folder / spare_client.REFUSED_NAME).read_text()
    _, err = fell_back(client(folder, "info", "5", ready_s=600))
    assert "the warm spare failed: OSError" in err


def test_a_zombie_spare_counts_as_ended() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_for(lambda: open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z")
    assert not spare_client.process_alive(proc.pid)  # the rule the client waits by
    proc.wait()
