"""The test tiers of tests/conftest.py: a test that starts torchrun is put in the slow tier by itself."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    committed_durations,
    core_slice,
    disk_shortfall,
    slowest_files_first,
    starts_torchrun,
    thread_share,
)

pytest_plugins = ["pytester"]
CONFTEST = Path(__file__).resolve().parent / "conftest.py"


@pytest.mark.parametrize("argv, launches", [
    ([sys.executable, "-m", "torch.distributed.run", "--standalone", "-m", "musubi.worker.worker"], True),
    ([sys.executable, "-m", "musubi.contract.rendezvous", "--nnodes", "2", "-m", "musubi.worker.worker"], True),
    ([sys.executable, "-m", "musubi.contract.rendezvous", "--standalone"], True),
    (["/opt/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"], True),
    ([sys.executable, "-m", "musubi.cli", "train", "job.yaml", "--nproc", "2"], True),
    ([sys.executable, "-m", "musubi.cli", "run", "fleet.yaml"], True),
    (["/repo/.venv/bin/musubi", "drill", "job.yaml", "--faults", "kill"], True),
    ([sys.executable, "-m", "musubi.cli", "train", "job.yaml", "--dry-run"], False),
    ([sys.executable, "-m", "musubi.cli", "check", "--json"], False),
    ([sys.executable, "-m", "musubi.cli", "--help"], False),
    (["git", "describe", "--always"], False),
    ("nvidia-smi topo -m", False),
])
def test_starts_torchrun_reads_the_argv(argv: list[str] | str, launches: bool) -> None:
    assert starts_torchrun(argv) is launches


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["one-process", "xdist"])
def test_a_test_that_starts_torchrun_joins_the_slow_tier_by_itself(pytester: pytest.Pytester,
                                                                   workers: list[str]) -> None:
    """First run: the launch is seen and named. Second run: the test is marked and `-m "not slow"` skips it.

    Also under pytest-xdist (`make test` runs `-n 3`): the tests run in worker processes, and the
    launch still reaches the main process's cache and summary. One worker is enough to prove that (it is
    a worker process all the same); each more worker is one more interpreter to start, twice.
    """
    if workers:
        pytest.importorskip("xdist")
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(test_launch="""
        import subprocess, sys

        def test_launches():  # argv as torchrun's, but a process that ends at once
            subprocess.run([sys.executable, "-c", "pass", "torch.distributed.run"], check=True)

        def test_in_process():
            assert 1 + 1 == 2
    """)
    first = pytester.runpytest_subprocess(*workers, "-v", "-m", "not slow")
    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines(["*started torchrun without the slow marker*", "test_launch.py::test_launches: *"])
    second = pytester.runpytest_subprocess(*workers, "-v", "-m", "not slow")
    # xdist's summary line counts no deselected tests: the verbose listing shows which test ran
    second.assert_outcomes(passed=1, **({} if workers else {"deselected": 1}))
    assert "test_launch.py::test_in_process" in second.stdout.str()
    assert "test_launch.py::test_launches" not in second.stdout.str()
    if not workers:  # the tier marker is the same code under xdist: one more launch of pytest would prove nothing new
        tier = pytester.runpytest_subprocess("-m", "distributed")
        tier.assert_outcomes(passed=1, deselected=1)


def test_slowest_files_first_keeps_each_file_together_in_its_order() -> None:
    ids = ["a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "b.py::t2", "d.py::t1"]
    seconds = {"a.py::t1": 1.0, "a.py::t2": 1.0, "b.py::t1": 0.5, "b.py::t2": 40.0, "c.py::t1": 2.0, "d.py::t1": 2.0}
    order = slowest_files_first(ids, seconds)
    # b (40.5 s) first, though its first test is quick; then a, c and d, 2 s each, a tie kept in collection order
    assert [ids[i] for i in order] == ["b.py::t1", "b.py::t2", "a.py::t1", "a.py::t2", "c.py::t1", "d.py::t1"]


def test_the_committed_durations_order_a_fresh_checkout() -> None:
    """CI has no pytest cache: tests/durations.json puts the slow files first there. It must parse, and it goes
    stale when most of the files it names are gone (refresh: `make test-durations` after `make test`)."""
    timed = committed_durations()
    assert len(timed) > 100 and all(v >= 0 for v in timed.values())
    root = Path(__file__).parent.parent
    files = {k.split("::")[0] for k in timed}
    gone = sorted(f for f in files if not (root / f).is_file())
    assert len(gone) <= len(files) // 10, f"tests/durations.json names {len(gone)} missing files, e.g. {gone[:3]}"
    slow = sorted(timed, key=timed.get)[-1]
    assert timed[slow] > 30, "the slowest committed test took under 30 s: durations of a partial run?"


def test_xdist_workers_start_the_file_that_took_longest_last_time(pytester: pytest.Pytester) -> None:
    """A run times each test (pytest's cache); the next xdist run hands out its file first."""
    pytest.importorskip("xdist")
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(test_a="def test_quick():\n    pass\n",
                        test_b="import time\n\ndef test_long():\n    time.sleep(0.3)\n")
    pytester.runpytest_inprocess("-p", "no:xdist").assert_outcomes(passed=2)
    # one worker runs the files in the order it was given them; xdist's own order (most tests first, then
    # collection order) would start test_a.py
    ordered = pytester.runpytest_subprocess("-n", "1", "--dist", "loadfile", "--no-loadscope-reorder", "-v")
    ordered.assert_outcomes(passed=2)
    out = ordered.stdout.str()
    assert out.index("test_b.py::test_long") < out.index("test_a.py::test_quick"), out


def test_many_xdist_workers_on_a_big_machine_share_its_cores() -> None:
    """24 workers on 64 cores each took 64 threads (seven CPU tests timed out on the GPU machine); two workers
    keep torch's default."""
    assert thread_share(2, 2) is None and thread_share(64, 2) is None
    assert thread_share(64, 24) == 4 and thread_share(64, 8) == 4 and thread_share(12, 8) == 3
    assert thread_share(4, 16) == 1 and thread_share(2, 3) == 1  # make test on the 2-core machine


def test_xdist_workers_on_a_big_machine_get_disjoint_core_slices_their_jobs_stay_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """8 workers on 16 cores pinned every test's ranks to the same cores 0-7 and 8-15 (the GPU machine): each
    worker now gets its own slice (of 2 cores at least, wrapped round where there are fewer a worker), and a job
    it launches splits that slice between its ranks."""
    from musubi.contract.env import MUSUBI_CPUS
    from musubi.launch.pin_plan import plan_pinning

    slices = [core_slice(list(range(16)), 8, w) for w in range(8)]
    assert all(s is not None and len(s) == 2 for s in slices)
    assert sorted(c for s in slices for c in s) == list(range(16))  # disjoint, every core used
    assert core_slice(list(range(16)), 8, 9) == slices[1]  # a replacement worker's number wraps around
    assert core_slice([0, 1], 3, 0) is None and core_slice([0, 1], 2, 1) is None  # the 2-core machine: shared
    assert core_slice(list(range(64)), 24, 23) == [46, 47]
    # 24 workers on 32 cores (the 2x H200 machine): 2 cores each still (a 2-rank launch needs 2), no core in more
    # than 2 slices, where without slices every test's ranks shared cores 0-15 and 16-31
    wrapped = [core_slice(list(range(32)), 24, w) for w in range(24)]
    assert all(s is not None and len(s) == 2 for s in wrapped)
    assert max(sum(c in s for s in wrapped if s) for c in range(32)) == 2
    assert core_slice([0, 1, 2], 3, 1) == [2, 0]
    # The launcher plans the ranks' cores inside the launching process's affinity (worker 2's slice here).
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(slices[2]))
    assert plan_pinning(True, "cpu", 2, {}).env == {MUSUBI_CPUS: "4;5"}


def test_the_suite_writes_nothing_into_a_lent_machines_out(pytester: pytest.Pytester,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU machine $OUT is what comes back: the rehearsal's bench copied its report there. Unset for every
    test, module fixtures included (they run before any function-scoped fixture could unset it)."""
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(test_out="""
        import os
        import pytest

        @pytest.fixture(scope="module")
        def seen():
            return os.environ.get("OUT")

        def test_no_out(seen):
            assert seen is None and "OUT" not in os.environ
    """)
    monkeypatch.setenv("OUT", str(pytester.path / "lent-out"))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_suite_names_a_disk_too_full_for_it_before_it_starts(tmp_path: Path) -> None:
    """Less free space than the suite needs: one line with the figures and the fix (CI once failed 383 tests with
    "No space left on device"); enough: nothing. A --basetemp not made yet is measured on its file system."""
    assert disk_shortfall(str(tmp_path), need=0) is None
    line = disk_shortfall(str(tmp_path / "not" / "made"), need=2**62)
    assert line is not None and "GiB free under" in line and "free some space" in line and "\n" not in line
