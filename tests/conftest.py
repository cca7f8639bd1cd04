"""Shared fixtures: tiny job files and a CLI runner that launches real torchrun jobs on CPU."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

TINY_JOB: dict[str, Any] = {
    "name": "tiny",
    "task": "tests.support.tiny_task:make",
    "model": "mlp",
    "data": {"synthetic": {"train_size": 128, "val_size": 30}, "workers": 0},
    "train": {"epochs": 2, "batch": 8, "lr": 0.1, "base_batch": 16, "log_every": 4, "seed": 3},
}


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def write_tiny_job(directory: Path, **extra: Any) -> Path:
    """Write TINY_JOB with `extra` merged in (nested keys kept) as a YAML file in `directory`; return its path."""
    data = _merge(TINY_JOB, extra)
    p = directory / f"{data['name']}.yaml"
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    return p


@pytest.fixture
def tiny_job(tmp_path: Path):
    """Write a tiny job YAML (with overrides) and return its path."""

    def make(**extra: Any) -> Path:
        return write_tiny_job(tmp_path, **extra)

    return make


@pytest.fixture(autouse=True)
def _cpu_and_repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run CPU ranks, from the repo root (user tasks resolve from the working directory)."""
    monkeypatch.setenv("MUSUBI_DEVICE", "cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(REPO)
    os.environ.pop("MUSUBI_INJECT", None)


# --- Test tiers -------------------------------------------------------------------------------------
# unit (in process) · distributed (starts torchrun on gloo CPU ranks) · system (Slurm, a browser, the
# recovery drill). `distributed` and `system` tests are also `slow`, so `pytest -m "not slow"` is the
# quick loop; CI runs every tier. A test need not be marked by hand: the spy below sees every process a
# test starts, and a test that started torchrun is remembered (pytest's cache) and marked from then on.

#: Tests of these fixtures or modules are the system tier: they need a daemon, a browser or many launches.
SYSTEM_FIXTURES = frozenset({"slurm_cluster"})
SYSTEM_MODULES = ("test_report_browser.py", "test_recovery_drill.py", "test_recovery_drill_dcp.py")
#: `musubi` commands that start torchrun unless told --dry-run or --help.
LAUNCHING_COMMANDS = frozenset({"train", "run", "drill"})
TORCHRUN_CACHE_KEY = "musubi/torchrun-tests"


def starts_torchrun(args: Any) -> bool:
    """True when a process started with `args` is torchrun, or a `musubi train/run/drill` that starts it."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    tokens = [os.fsdecode(a) for a in argv]
    # musubi starts torchrun through its own rendezvous wrapper module (`python -m musubi....rendezvous`)
    if any(t == "torch.distributed.run" or Path(t).name == "torchrun"
           or (t.startswith("musubi.") and t.endswith(".rendezvous")) for t in tokens):
        return True
    for i, t in enumerate(tokens):
        if t == "musubi.cli" or Path(t).name == "musubi":
            command = next((c for c in tokens[i + 1:] if not c.startswith("-")), None)
            return command in LAUNCHING_COMMANDS and not {"--dry-run", "--help"} & set(tokens)
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each test in its tier: system by fixture or module, distributed when marked slow or seen starting torchrun."""
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    seen = set(cache.get(TORCHRUN_CACHE_KEY, [])) if cache is not None else set()
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & SYSTEM_FIXTURES or item.path.name in SYSTEM_MODULES:
            item.add_marker(pytest.mark.system)
        elif item.nodeid in seen or item.get_closest_marker("slow") is not None:
            if item.get_closest_marker("gpu") is None:
                item.add_marker(pytest.mark.distributed)
        if (item.get_closest_marker("system") or item.get_closest_marker("distributed")) \
                and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: every worker sorts alike (same cache)
        # This checkout's last timings over the committed ones: a fresh checkout (CI) orders by the latter.
        timed = {**committed_durations(), **(cache.get(DURATIONS_CACHE_KEY, {}) if cache is not None else {})}
        seconds = {item.nodeid: timed.get(item.nodeid, UNTIMED_SLOW_S if item.get_closest_marker("slow")
                                          else UNTIMED_UNIT_S) for item in items}
        items[:] = [items[i] for i in slowest_files_first([item.nodeid for item in items], seconds)]


# --- Slowest files first under pytest-xdist -----------------------------------------------------------
# `make test` runs `--dist loadfile --no-loadscope-reorder`: xdist hands out whole files in collection
# order (its default order, most tests first, would start a 1-test 85 s file last and leave one worker
# running it alone at the end). So the workers collect the files slowest first, by each test's duration
# in the last run that timed it (pytest's cache, written by the main process), and the tail is small files.

#: pytest's cache key of each test's last duration in seconds (setup + call + teardown).
DURATIONS_CACHE_KEY = "musubi/test-durations"
#: The guess for a test no run has timed yet: a torchrun or system test takes tens of seconds on 2 cores.
UNTIMED_SLOW_S, UNTIMED_UNIT_S = 30.0, 0.1


#: Durations of a whole `make test` on the 2-core development machine, committed so that a fresh checkout
#: (CI has no pytest cache) starts the slow files first too; `make test-durations` refreshes it from the
#: last run's cache (pytest-split keeps its `.test_durations` the same way).
COMMITTED_DURATIONS = Path(__file__).with_name("durations.json")


def committed_durations() -> dict[str, float]:
    """The committed per-test seconds, or {} when the file is missing or unreadable (order falls back to guesses)."""
    try:
        data = json.loads(COMMITTED_DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def slowest_files_first(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """Indices of `nodeids`, file by file, the file of most seconds first; ties and a file's tests keep their order."""
    files: dict[str, list[int]] = {}
    for i, nodeid in enumerate(nodeids):
        files.setdefault(nodeid.split("::")[0], []).append(i)
    total = {name: sum(seconds[nodeids[i]] for i in idx) for name, idx in files.items()}
    return [i for name in sorted(files, key=lambda name: -total[name]) for i in files[name]]


UNMARKED_LAUNCHES = pytest.StashKey[list[str]]()
#: The test report's user property that carries a test's first torchrun launch to the main pytest process.
LAUNCH_PROPERTY = "musubi_torchrun_launch"


@pytest.fixture(autouse=True)
def _torchrun_spy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Watch the processes this test starts; one that starts torchrun puts the test in the distributed tier."""
    import subprocess

    launched: list[str] = []
    real_init = subprocess.Popen.__init__

    def spying_init(self: subprocess.Popen, args: Any, *a: Any, **kw: Any) -> None:
        if not launched and starts_torchrun(args):
            launched.append(" ".join(os.fsdecode(x) for x in ([args] if isinstance(args, str) else args))[:200])
        real_init(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", spying_init)
    yield
    if launched:
        # A report property, not the cache: under pytest-xdist (`make test`) the tests run in worker
        # processes, and only the main process sees every report and may write the cache without races.
        request.node.user_properties.append((LAUNCH_PROPERTY, launched[0]))


class _LaunchRecorder:
    """In the main pytest process: remember a test that started torchrun (pytest's cache), name it if unmarked;
    time every test for the next run's file order."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        launch = next((v for k, v in report.user_properties if k == LAUNCH_PROPERTY), None)
        if report.when != "teardown" or launch is None:
            return
        cache = getattr(self.config, "cache", None)  # absent under -p no:cacheprovider
        if cache is not None:
            seen = set(cache.get(TORCHRUN_CACHE_KEY, []))
            if report.nodeid not in seen:
                cache.set(TORCHRUN_CACHE_KEY, sorted(seen | {report.nodeid}))
        if "slow" not in report.keywords:
            self.config.stash.setdefault(UNMARKED_LAUNCHES, []).append(f"{report.nodeid}: {launch}")

    def pytest_sessionfinish(self) -> None:
        # At the end, not per test: xdist workers read the cache when they collect, and a worker started
        # mid-run (one replaced after a crash) must collect in the same order as the others did.
        cache = getattr(self.config, "cache", None)
        if cache is not None and self.seconds:
            timed = cache.get(DURATIONS_CACHE_KEY, {})
            cache.set(DURATIONS_CACHE_KEY, {**timed, **{k: round(v, 3) for k, v in self.seconds.items()}})


#: Intra-op threads at most for a pytest-xdist worker of many (see thread_share).
TEST_THREADS = 4


def thread_share(cores: int, workers: int) -> int | None:
    """Intra-op threads for each of `workers` pytest-xdist workers on `cores` cores, or None to leave torch's
    default. torch gives every process one thread a core; with many workers on a big machine that multiplies:
    on the 64-core GPU machine, 24 workers ran 24 x 64 threads and seven heavy CPU tests (EfficientDet,
    D-FINE, export parity, the demo's external job) hit their 300-s timeouts (2026-11-26, torch 2.11). Capped
    at twice the cores in all and at TEST_THREADS a worker: the tests' models are tiny, and more threads only
    add synchronisation (with 16 threads a worker, 8 workers on those 64 cores, dfine_s's loss test still
    took 46.9 s against 6.8 s with 2 threads here; the cap of 4 is not yet measured there). `make test` runs
    three workers on this 2-core machine: one thread each (11 min 10 s and 11 min 47 s in all against 11 min
    39 s and 12 min 01 s with two workers at torch's default of two threads, 2026-11-27). Two workers or fewer keep the
    default."""
    if workers <= 2:
        return None
    return max(1, min(TEST_THREADS, 2 * cores // workers))


#: Cores a pytest-xdist worker's slice holds at least: `musubi train` refuses more CPU ranks than the cores its
#: process may use (launch/admission.py), and most tests launch 2 ranks.
SLICE_MIN_CORES = 2


def core_slice(allowed: list[int], workers: int, worker: int) -> list[int] | None:
    """The cores of xdist worker number `worker` of `workers`: a contiguous slice of `allowed`, its share of them
    but at least SLICE_MIN_CORES; disjoint where there are that many cores a worker, else wrapped round so that no
    core is in more than ceil(workers x SLICE_MIN_CORES / cores) slices. None when the slice would be every core
    (the 2-core machine's three workers share both). The launcher splits a job's ranks over the cores the launching
    process may use (its affinity, as under a Slurm cgroup: topology/cores.py read_cpus), so a worker's jobs stay
    in its slice. Without it, on the GPU machine (16 cores, 8 workers) every concurrent test's ranks were pinned to
    the same cores 0-7 and 8-15 with 8 threads each: the scenario drills' 33-ms steps took 200 ms and a 150-s bench
    timed out; with 24 workers on 32 cores a soak's hang was never detected in 3.5 minutes."""
    cores = sorted(allowed)
    share = max(SLICE_MIN_CORES, len(cores) // max(1, workers))
    if share >= len(cores):
        return None
    start = (worker % workers) * share  # a worker xdist started to replace a crashed one reuses a slice
    return [cores[(start + i) % len(cores)] for i in range(share)]


def _share_cores_between_workers(config: pytest.Config) -> None:
    """In an xdist worker: its own slice of the cores where the machine has more than 2 (core_slice), torch's
    threads set to its share of the cores (see thread_share), and OMP_NUM_THREADS for the jobs it starts to
    half of it (most launch two ranks; unset, the launcher would give each rank cores / ranks, as if the
    machine were the job's alone)."""
    info = getattr(config, "workerinput", {})
    workers = int(info.get("workercount", 1))
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    digits = "".join(c for c in str(info.get("workerid", "")) if c.isdigit())
    mine = core_slice(allowed, workers, int(digits)) if allowed and digits and workers > 1 else None
    if mine is not None:
        from musubi.worker.pinning import pin_all_threads

        pin_all_threads(tuple(mine))  # every thread this worker has, and every process it starts
    # A slice is this worker's alone: one thread a core of it (torch's default would count the machine's).
    share = min(TEST_THREADS, len(mine)) if mine is not None else thread_share(os.cpu_count() or 1, workers)
    if share is None:
        return
    import torch

    torch.set_num_threads(share)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, share // 2)))


#: The variable a lent device machine returns files from: benches the tests run copy their results there when it
#: is set (bench/quality.py put the CPU rehearsal's report into the GPU machine's $OUT), so the suite unsets it.
LENT_OUT = "OUT"


#: What the whole suite keeps on disk at its peak (the module fixtures' runs and the tests under way; a passing
#: test's tmp_path is removed at its teardown; measured in docs/testing.md, "Session 27"), with some room to spare.
SUITE_DISK_BYTES = 3 * 2**30


def disk_shortfall(folder: str, need: int = SUITE_DISK_BYTES) -> str | None:
    """One line naming the shortfall where `folder`'s file system has less than `need` bytes free, else None."""
    import shutil

    where = Path(folder)
    while not where.exists() and where != where.parent:  # a --basetemp not made yet: its file system
        where = where.parent
    free = shutil.disk_usage(where).free
    if free >= need:
        return None
    return (f"only {free / 2**30:.1f} GiB free under {folder}; the suite needs {need / 2**30:.0f} GiB there for its "
            f"runs: free some space (old pytest-of-* folders, fresh clones) or point TMPDIR elsewhere")


def pytest_configure(config: pytest.Config) -> None:
    """Record torchrun launches where every report arrives (the main process, also under pytest-xdist);
    in a worker, take only its share of the cores. In every process, no $OUT: a test writes under its tmp_path.
    The main process first checks the disk: a full one failed hundreds of tests with "No space left on device"."""
    os.environ.pop(LENT_OUT, None)  # before collection and module fixtures (the rehearsal's is one)
    if not hasattr(config, "workerinput"):  # an xdist worker: its reports go to the main process
        import tempfile

        short = disk_shortfall(str(config.option.basetemp or tempfile.gettempdir()))
        if short and not config.option.collectonly:
            pytest.exit(short, returncode=4)
        config.pluginmanager.register(_LaunchRecorder(config), "musubi-launch-recorder")
    else:
        _share_cores_between_workers(config)


#: The suite's spare server (tests/support/spare_server.py), where this process started one.
SPARE_SERVER = pytest.StashKey[tuple]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Where this process runs a slow test (a launch), start a spare server and name it to every launch: each
    launch's warm spare is then forked from it, not an interpreter importing torch (3-6 s of CPU a launch). Not
    in xdist's controller, which runs no test."""
    config = session.config
    runs_tests = hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)
    if not runs_tests or not any(item.get_closest_marker("slow") for item in session.items):
        return
    try:
        from tests.support import spare_server
    except ImportError:  # this conftest copied into a pytester folder (tests/test_tiers.py): no launches there
        return
    if spare_server.wanted(dict(os.environ)):
        proc, folder = spare_server.start_server()
        config.stash[SPARE_SERVER] = (proc, folder)
        os.environ[spare_server.MUSUBI_SPARE_SERVER] = str(folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the suite's spare server, if this process started one."""
    started = config.stash.get(SPARE_SERVER, None)
    if started is not None:
        from tests.support import spare_server

        spare_server.stop_server(*started)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Name the tests that started torchrun outside the slow tier (they are marked from the next run on)."""
    unmarked = config.stash.get(UNMARKED_LAUNCHES, [])
    if unmarked:
        terminalreporter.section("tests that started torchrun without the slow marker (now remembered)")
        for line in unmarked:
            terminalreporter.write_line(line)
