"""PYTHONPATH for a subprocess that must import this checkout: the repository first, then what the caller had.

The GPU machine's tier installs the extras its image lacks (pydantic among them) with `pip --target` and
puts them on PYTHONPATH; a test that replaced PYTHONPATH with the repository alone started a `musubi` that
could not import pydantic there. Prepending keeps both.
"""

from __future__ import annotations

import os
from pathlib import Path


def repo_on_path(repo: Path) -> str:
    """`repo` followed by the current PYTHONPATH (if any), for a child process's environment."""
    rest = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([str(repo), *([rest] if rest else [])])
