"""The test tiers of tests/conftest.py: a test that starts torchrun is put in the slow tier by itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import starts_torchrun

pytest_plugins = ["pytester"]
CONFTEST = Path(__file__).resolve().parent / "conftest.py"


@pytest.mark.parametrize("argv, launches", [
    ([sys.executable, "-m", "torch.distributed.run", "--standalone", "-m", "musubi.worker.worker"], True),
    ([sys.executable, "-m", "musubi.launch.rendezvous", "--nnodes", "2", "-m", "musubi.worker.worker"], True),
    ([sys.executable, "-m", "musubi.launch.rendezvous", "--standalone"], True),
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


def test_a_test_that_starts_torchrun_joins_the_slow_tier_by_itself(pytester: pytest.Pytester) -> None:
    """First run: the launch is seen and named. Second run: the test is marked and `-m "not slow"` skips it."""
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(test_launch="""
        import subprocess, sys

        def test_launches():  # argv as torchrun's, but a process that ends at once
            subprocess.run([sys.executable, "-c", "pass", "torch.distributed.run"], check=True)

        def test_in_process():
            assert 1 + 1 == 2
    """)
    first = pytester.runpytest_subprocess("-m", "not slow")
    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines(["*started torchrun without the slow marker*", "test_launch.py::test_launches: *"])
    second = pytester.runpytest_subprocess("-m", "not slow")
    second.assert_outcomes(passed=1, deselected=1)
    tier = pytester.runpytest_subprocess("-m", "distributed")
    tier.assert_outcomes(passed=1, deselected=1)
