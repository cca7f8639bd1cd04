"""The suite's spare server (musubi/worker/spare_server.py): one per pytest process that runs tests, so that each
launch's warm spare is a fork of it instead of an interpreter importing torch (tests/conftest.py starts it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from musubi.contract.env import MUSUBI_SPARE_SERVER, MUSUBI_WARM_SPARE
from musubi.contract.spare_client import LOG_NAME

REPO = Path(__file__).resolve().parents[2]


def wanted(env: dict[str, str]) -> bool:
    """Whether the suite starts one: not when a server is named already or the warm spare is off."""
    return not env.get(MUSUBI_SPARE_SERVER) and env.get(MUSUBI_WARM_SPARE, "1").strip() not in ("0", "false")


def start_server() -> tuple[subprocess.Popen, Path]:
    """A server in a fresh folder under /tmp (a short socket path), its output in the folder's log; it dies with
    this process. The caller exports the folder as MUSUBI_SPARE_SERVER."""
    folder = Path(tempfile.mkdtemp(prefix="musubi-zygote-", dir="/tmp"))
    with open(folder / LOG_NAME, "a", encoding="utf-8") as log:
        proc = subprocess.Popen([sys.executable, "-m", "musubi.worker.spare_server", str(folder)], cwd=REPO,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    return proc, folder


def stop_server(proc: subprocess.Popen, folder: Path) -> None:
    """SIGTERM (it ends once the spares it forked ended), SIGKILL after 10 s; its folder removed."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    shutil.rmtree(folder, ignore_errors=True)
    if os.environ.get(MUSUBI_SPARE_SERVER) == str(folder):
        del os.environ[MUSUBI_SPARE_SERVER]
