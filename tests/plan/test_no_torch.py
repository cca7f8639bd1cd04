"""The planner is pure math: importing it (and its command) must not import torch."""

from __future__ import annotations

import subprocess
import sys


def test_import_plan_leaves_torch_out() -> None:
    code = ("import sys, musubi.plan, musubi.cli.plan, musubi.plan.search, musubi.plan.calibrate, musubi.plan.from_run; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
