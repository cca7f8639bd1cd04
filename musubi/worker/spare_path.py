"""The sys.path of a spare forked by a server: the one `python -m` would start with in the launch's folder and with
its PYTHONPATH, over the server's own standard folders (the standard library, site-packages and their .pth files).

Kept apart from musubi/worker/spare.py, which imports torch: these are read by tests in fresh interpreters.
"""

from __future__ import annotations

import os
import sys


def python_path(env: dict[str, str]) -> list[str]:
    """The folders PYTHONPATH puts on a new interpreter's sys.path, as it puts them (absolute, an empty entry the
    working folder)."""
    value = env.get("PYTHONPATH", "")
    return [os.path.abspath(p) if p else os.getcwd() for p in value.split(os.pathsep)] if value else []


def server_base_path() -> list[str]:
    """This interpreter's sys.path without what its start put first: `-m`'s working folder and PYTHONPATH's.

    Skipped by value, not counted: the start drops repeats (`site.removeduppaths`: a PYTHONPATH folder equal to the
    working folder or listed twice), and a count then cut the standard library off the base. The spares forked from
    such a server could not import what the server had not (torchrun's agent: "unknown encoding: idna")."""
    given, rest = set(python_path(dict(os.environ))), sys.path[1:]
    start = next((i for i, folder in enumerate(rest) if folder not in given), len(rest))
    return rest[start:]


def fresh_path(base: list[str]) -> list[str]:
    """The sys.path `python -m` would start with here: this working folder, then this environment's PYTHONPATH and
    the base without repeats (the start drops those past the first folder, which it puts there afterwards)."""
    return [os.getcwd(), *dict.fromkeys([*python_path(dict(os.environ)), *base])]
