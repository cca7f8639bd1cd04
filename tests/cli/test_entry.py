"""The `musubi` script's exit (musubi/cli/entry.py): the command's exit code, its whole output through a pipe and
the atexit handlers, with the interpreter's teardown of torch skipped only when nothing else is alive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import atexit, sys, threading, time
{pre}
marker = sys.argv[1]
atexit.register(lambda: open(marker, "w").write("atexit ran"))
sys.argv = ["musubi", *sys.argv[2:]]
from musubi.cli.entry import main
main()
"""


def run(tmp_path: Path, args: list[str], pre: str = "import torch") -> tuple[subprocess.CompletedProcess, str]:
    marker = tmp_path / "atexit.txt"
    out = subprocess.run([sys.executable, "-c", PROBE.format(pre=pre), str(marker), *args], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    return out, marker.read_text(encoding="utf-8") if marker.exists() else ""


@pytest.mark.parametrize("pre", ["import torch", "pass", "import torch; threading.Thread(target=time.sleep, "
                                                          "args=(0.5,)).start()"])
def test_exit_code_output_and_atexit_as_the_interpreters_own(tmp_path: Path, pre: str) -> None:
    """With torch imported (the fast exit), without (the interpreter's) and with a thread alive (the interpreter's,
    which waits for it): the help's whole text through a pipe, exit 0; a missing job file: its one line, exit 2;
    the atexit handlers ran every time."""
    out, marker = run(tmp_path, ["--help"], pre)
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout and "train" in out.stdout and out.stdout.rstrip().endswith("╯")
    assert marker == "atexit ran"
    out, marker = run(tmp_path, ["train", str(tmp_path / "none.yaml")], pre)
    assert out.returncode == 2
    assert "no such file" in out.stderr and marker == "atexit ran"


def test_the_script_and_python_m_use_the_entry() -> None:
    """pyproject's script and `python -m musubi.cli` both go through entry.main (else the fast exit is lost)."""
    assert 'musubi = "musubi.cli.entry:main"' in (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert "from musubi.cli.entry import main" in (REPO / "musubi/cli/__main__.py").read_text(encoding="utf-8")
