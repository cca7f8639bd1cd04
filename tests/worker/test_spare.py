"""The warm spare and its thin client as real processes on a tiny entry (tests/support/spare_entry.py), then
torchrun's agent forked by a real launch's spare.

One spare (no torch: `--warm ""`) serves the module's clients; a client is what torchrun would start per rank.
A rank forked by the spare must be indistinguishable to torchrun from one started the plain way: its output on
the client's fds, its exit code or its death by signal mirrored by the client, signals forwarded, and the rank
gone when the client is SIGKILLed; with no ready spare the client runs the plain `python -m` entry.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from musubi.contract import spare_client
from musubi.contract.env import MUSUBI_SPARE_SERVER, MUSUBI_WARM_SPARE
from musubi.contract.exits import EXIT_SPARE_GONE
from musubi.launch.launch import torchrun_argv
from musubi.launch.spare import WarmSpare, agent_command, client_command, stop_spare, wanted
from tests.conftest import write_tiny_job
from tests.support.waiting import wait_for

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
    """The spare killed under a running rank: the rank dies with it (PR_SET_PDEATHSIG), its client exits 79
    (EXIT_SPARE_GONE: the launcher relaunches without a spare) and says so, and a later client finds nobody
    listening and starts plain."""
    proc = start(tmp_path)
    assert wait_for(lambda: (tmp_path / spare_client.SOCKET_NAME).exists()), "the spare never listened"
    pid_file = tmp_path / "pid"
    c = client(tmp_path, "wait", str(pid_file))
    assert wait_for(pid_file.exists), "the rank never started"
    rank = int(pid_file.read_text())
    proc.kill()
    proc.wait(timeout=30)
    _, err = c.communicate(timeout=30)
    assert c.returncode == EXIT_SPARE_GONE, err
    assert f"the warm spare ended before {ENTRY} pid {rank}; it was killed" in err, err
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
    assert plain[:3] == [sys.executable, "-m", "musubi.contract.rendezvous"]
    # torchrun's agent too: the launcher runs the client, which has the spare fork the agent
    forked = torchrun_argv(tmp_path / "job", 2, True, None, entry=client_command(spare), agent=agent_command(spare))
    assert forked[:9] == [sys.executable, "-I", "-S", spare_client.__file__, str(tmp_path), "60",
                          "musubi.contract.rendezvous", "--", "--standalone"]


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


# --- torchrun's agent forked by a real launch's spare (gloo, 2 ranks) -----------------------------------------------
# Three tests share one live `musubi train` (a job far longer than they wait), in this order: the agent is the
# spare's child with a fresh process's state; the spare serves its two entries only; SIGKILLing the launcher then
# ends every process of the launch (the spare dies with the launcher, its children with the spare).


def musubi_train(job: Path, out: Path, nohup: bool = False) -> subprocess.Popen:
    """`musubi train JOB` on 2 CPU ranks, its output piped; `nohup`: started with SIGHUP ignored as nohup does,
    SIGQUIT as a shell's background job has it, and SIGUSR2 as `trap '' USR2` would (torchrun catches none but it)."""
    env = dict(os.environ, MUSUBI_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
    env.pop(MUSUBI_WARM_SPARE, None)
    env.pop(MUSUBI_SPARE_SERVER, None)  # the launcher's own spare, its child (test_spare_server.py: a served one)
    return subprocess.Popen([sys.executable, "-m", "musubi.cli", "train", str(job), "--nproc", "2", "--device", "cpu",
                             "--out", str(out), "--no-check"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=ignore_hup_and_usr2 if nohup else None)


def ignore_hup_and_usr2() -> None:
    """In the child before exec: SIGHUP, SIGQUIT and SIGUSR2 ignored (an ignored disposition survives exec)."""
    for sig in (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)


@dataclass
class Live:
    """A training launch in flight: the launcher, its job folder, its spare's pid and folder, the agent's pid."""

    proc: subprocess.Popen
    job_dir: Path
    spare_pid: int
    spare_dir: Path
    agent: int


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("live")
    proc = musubi_train(write_tiny_job(tmp, train={"epochs": 5000}), tmp / "run", nohup=True)
    jd = tmp / "run" / "tiny"
    spare_dir = None
    try:
        assert wait_for(lambda: any(p.stat().st_size for p in (jd / "progress").glob("*.jsonl")), timeout=180), \
            proc.poll()
        log = (jd / "logs" / "spare.log").read_text()
        agent = int(log.split("torchrun agent pid ")[1].split()[0])
        (spare,) = [c for c in psutil.Process(proc.pid).children() if "musubi.worker.spare" in c.cmdline()]
        spare_dir = Path(spare.cmdline()[3])
        yield Live(proc, jd, spare.pid, spare_dir, agent)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)
    if spare_dir is not None:  # a SIGKILLed launcher cannot remove its spare's folder
        shutil.rmtree(spare_dir, ignore_errors=True)


def unix_inodes(folder: Path) -> set[str]:
    """Inodes of the Unix sockets bound in `folder`, listening or accepted (/proc/net/unix)."""
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return {f"socket:[{f[6]}]" for f in (ln.split() for ln in lines) if len(f) > 7 and f[7].startswith(str(folder))}


def signal_state(pid: int) -> dict[str, int]:
    """The blocked, ignored and caught signal masks of `pid`."""
    rows = (ln.split(":") for ln in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {k: int(v.strip(), 16) for k, v in rows if k in ("SigBlk", "SigIgn", "SigCgt")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchruns_agent_is_forked_by_the_spare_with_a_fresh_processs_state(live: Live) -> None:
    agent = psutil.Process(live.agent)
    client = [c for c in psutil.Process(live.proc.pid).children() if spare_client.__file__ in c.cmdline()]
    assert len(client) == 1 and "musubi.contract.rendezvous" in client[0].cmdline(), client
    log = (live.job_dir / "logs" / "spare.log").read_text()
    assert f"torchrun agent pid {live.agent} forked for client pid {client[0].pid}" in log, log
    assert agent.ppid() == live.spare_pid and os.getsid(live.agent) == live.agent
    # torchrun's rank clients are the agent's children, the ranks the spare's; none fell back
    rank_clients = agent.children()
    assert len(rank_clients) == 2 and all(spare_client.__file__ in c.cmdline() for c in rank_clients)
    assert log.count("rank pid ") == 2 and "warm spare not used" not in (live.job_dir / "logs" / "torchrun.log").read_text()
    # No fd of the spare's: its socket (listening or a client's), its log, a pidfd
    fds = {os.readlink(f"/proc/{live.agent}/fd/{fd}") for fd in os.listdir(f"/proc/{live.agent}/fd")}
    spare_fds = unix_inodes(live.spare_dir) | {str(live.job_dir / "logs" / "spare.log"), "anon_inode:[pidfd]"}
    assert unix_inodes(live.spare_dir) and not fds & spare_fds, fds & spare_fds
    # No signal blocked; every signal a process does not handle itself ignored exactly when its client ignores it:
    # the client is a new interpreter started where the plain process would be (Python's SIGPIPE and SIGXFSZ; the
    # launch runs with SIGHUP, SIGQUIT and SIGUSR2 ignored, as under nohup in a background job).
    def bit(sig: int) -> int:
        return 1 << (sig - 1)

    # (Read until unblocked: CPython blocks every signal for the instant of a fork (_posixsubprocess), and a loaded
    # machine caught the agent there once; a mask inherited from the spare would stay.)
    assert wait_for(lambda: signal_state(live.agent)["SigBlk"] == 0, timeout=10), signal_state(live.agent)
    state, plain = signal_state(live.agent), signal_state(client[0].pid)
    assert state["SigIgn"] == plain["SigIgn"] & ~state["SigCgt"], (state, plain)
    assert plain["SigIgn"] & bit(signal.SIGHUP) and state["SigIgn"] & bit(signal.SIGUSR2), (state, plain)
    # A rank's client was started by the agent, which catches SIGQUIT: it has it at its default, and so must the
    # rank (the spare, the launcher's child, inherited it ignored)
    ranks = [p for p in psutil.Process(live.spare_pid).children() if p.pid != live.agent]
    rank_plain = signal_state(rank_clients[0].pid)
    assert len(ranks) == 2 and not rank_plain["SigIgn"] & bit(signal.SIGQUIT), (ranks, rank_plain)
    for rank in ranks:
        assert wait_for(lambda pid=rank.pid: signal_state(pid)["SigBlk"] == 0, timeout=10), signal_state(rank.pid)
        mine = signal_state(rank.pid)
        assert mine["SigIgn"] == rank_plain["SigIgn"] & ~mine["SigCgt"], (mine, rank_plain)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_spare_serves_the_launchs_entries_only(live: Live) -> None:
    """A client of the same user asking for another module is refused in one line; nothing is forked."""
    spare_log = live.job_dir / "logs" / "spare.log"
    forked = spare_log.read_text().count(" forked for client pid ")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(live.spare_dir / spare_client.SOCKET_NAME))
    with sock, open(os.devnull) as null:
        spare_client.send_message(sock, spare_client.request("os", ["-c", "print(1)"], time.time()), [null.fileno()] * 3)
        reply, _ = spare_client.receive_message(sock)
    assert reply == {"refused": "the warm spare runs musubi.worker.worker, musubi.contract.rendezvous and "
                                "musubi.launch.task_checks only, not 'os'"}, reply
    # the launch's torch checks (for the launcher), torchrun's agent, two ranks
    assert spare_log.read_text().count(" forked for client pid ") == forked == 4
    assert not (live.spare_dir / spare_client.REFUSED_NAME).exists(), "one bad client must not turn the spare off"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sigkilled_launcher_leaves_no_agent_rank_or_spare(live: Live) -> None:
    tree = psutil.Process(live.proc.pid).children(recursive=True)
    assert {live.agent, live.spare_pid} <= {p.pid for p in tree} and len(tree) >= 7, tree  # + 2 ranks, 3 clients
    live.proc.kill()
    live.proc.communicate(timeout=60)
    _, alive = psutil.wait_procs(tree, timeout=60)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_refusing_spare_still_launches_agent_and_ranks_the_plain_way(tmp_path: Path) -> None:
    """The task module starts a thread at import: the spare refuses to fork, and torchrun's agent and rank 0 each
    say so once and start as new interpreters; the job completes."""
    proc = musubi_train(write_tiny_job(tmp_path, task="tests.support.threaded_task:make"), tmp_path / "run")
    out, _ = proc.communicate(timeout=360)
    assert proc.returncode == 0, out
    logs = tmp_path / "run" / "tiny" / "logs"
    torchrun_log = (logs / "torchrun.log").read_text()
    for module in ("musubi.contract.rendezvous", "musubi.worker.worker"):
        said = [ln for ln in torchrun_log.splitlines() if ln.endswith(f"; {module} starts in a fresh interpreter")]
        assert len(said) == 1 and "threads alive in the warm spare after its imports" in said[0], torchrun_log
    assert "forked" not in (logs / "spare.log").read_text()


PRELOAD_PROBE = """
import json, sys
from pathlib import Path
from musubi.worker import spare
job = Path(sys.argv[1])
before = {m for m in sys.modules if m.startswith(("transformers", "effdet"))}
spare.warm(job, [])
print(json.dumps({"before": sorted(before), "after": sorted(m for m in sys.modules
                                                         if m.startswith(("transformers", "effdet")))}))
"""


@pytest.mark.parametrize(("task", "model", "loaded"), [
    ("detection", "rtdetr_r18", "transformers.models.rt_detr.modeling_rt_detr"),
    ("detection", "fasterrcnn_mobilenet_v3_large_320_fpn", None),
    ("tests.support.tiny_task:make", "mlp", None),
])
def test_the_spare_preloads_a_builtin_models_libraries_only(tmp_path: Path, task: str, model: str,
                                                            loaded: str | None) -> None:
    """A DETR job's spare imports transformers' model module before it forks (each rank imported it after the fork:
    ~4.4 s of CPU a rank); a torchvision model needs nothing more; a user task's function is never called."""
    config = {"name": "p", "task": task, "model": model,
              "data": {"synthetic": {"train_size": 8, "val_size": 4, "image_size": 64, "num_classes": 2}}}
    (tmp_path / "job.json").write_text(json.dumps({"config": config}), encoding="utf-8")
    out = subprocess.run([sys.executable, "-c", PRELOAD_PROBE, str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=240, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert not any(m.startswith("transformers.models.rt_detr") for m in seen["before"])
    if loaded is None:
        assert not any(m.startswith(("transformers.models.", "effdet")) for m in seen["after"]), seen["after"]
    else:
        assert loaded in seen["after"]


def test_the_spare_reads_the_jobs_config_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One read of job.json gives the task module to import and the built-in model's libraries to preload."""
    from musubi.worker import spare

    config = {"name": "p", "task": "tests.support.tiny_task:make", "model": "mlp"}
    (tmp_path / "job.json").write_text(json.dumps({"config": config}), encoding="utf-8")
    reads: list[Path] = []
    read_text = Path.read_text

    def counted(self: Path, *args: object, **kwargs: object) -> str:
        if self.name == "job.json":
            reads.append(self)
        return read_text(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counted)
    assert spare.warm(tmp_path, []) == [] and reads == [tmp_path / "job.json"]


def test_a_forked_rank_takes_the_thread_count_its_environment_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's pools were sized from the spare's OMP_NUM_THREADS at its import; the rank's own value wins, as in a
    new interpreter, and an unchanged one is left alone."""
    import torch

    from musubi.worker.spare import follow_thread_count

    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    monkeypatch.setenv("OMP_NUM_THREADS", str(other))
    try:
        follow_thread_count(imported=str(other))
        assert torch.get_num_threads() == before  # what the spare imported with: nothing to change
        follow_thread_count(imported=str(before))
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("repeats", [False, True])
def test_a_servers_base_path_is_the_standard_one_whatever_pythonpath_repeats(tmp_path: Path, repeats: bool) -> None:
    """The base a server forks its spares on is the sys.path a `python -m` started without PYTHONPATH has past its
    first folder, also when PYTHONPATH names the working folder or a folder twice (the start drops those repeats)."""
    repo = str(Path(__file__).resolve().parents[2])
    extra = tmp_path / "extra"
    extra.mkdir()
    given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # the GPU machine's pydantic
    folders = [repo, str(extra), *([repo, str(tmp_path)] if repeats else []), *given]
    code = "import json, sys; from musubi.worker.spare_path import server_base_path; print(json.dumps(server_base_path()))"
    (extra / "print_base.py").write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base = json.loads(subprocess.run([sys.executable, "-m", "print_base"], cwd=tmp_path, capture_output=True,
                                     text=True, check=True, env={**env, "PYTHONPATH": os.pathsep.join(folders)}
                                     ).stdout)
    standard = json.loads(subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                                         cwd=tmp_path, capture_output=True, text=True, check=True, env=env).stdout)
    assert base == standard
