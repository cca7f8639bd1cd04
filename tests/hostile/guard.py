"""A scratch folder and a tripwire: hostile inputs may write inside `scratch`, nowhere else.

`Guard.check()` compares a listing (size, mtime, mode) of the repository, HOME and
the test's folder outside `scratch` with the one taken before, and fails on any
file created, changed or removed there. `outside/` holds the victims hostile
inputs aim at (`../../outside/victim.txt`, a `pwned` file a payload would create).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Caches written by Python and the test tools themselves (not by Musubi).
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".venv", ".mypy_cache"}


def listing(roots: list[Path], skip: set[Path]) -> dict[str, tuple]:
    """{path: (kind, size, mtime_ns, mode)} of everything under `roots`, minus `skip` and caches."""
    out: dict[str, tuple] = {}
    for root in roots:
        if not root.exists():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and Path(dirpath, d) not in skip]
            for name in [*filenames, *dirnames]:
                p = os.path.join(dirpath, name)
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    continue
                is_dir = name in dirnames
                out[p] = ("dir" if is_dir else "file", 0 if is_dir else st.st_size,
                          0 if is_dir else st.st_mtime_ns, st.st_mode)
    return out


@dataclass
class Guard:
    """Scratch, outside and home folders of one hostile case, with the tripwire."""

    root: Path

    def __post_init__(self) -> None:
        self.scratch = self.root / "scratch"
        self.outside = self.root / "outside"
        self.home = self.root / "home"
        for d in (self.scratch, self.outside, self.home, self.scratch / "tmp"):
            d.mkdir(parents=True, exist_ok=True)
        (self.outside / "victim.txt").write_text("precious\n", encoding="utf-8")
        (self.home / ".bashrc").write_text("# user's own\n", encoding="utf-8")
        self.pwned = self.outside / "pwned"
        self._before = self._now()

    def _now(self) -> dict[str, tuple]:
        return listing([self.root, REPO], {self.scratch})

    def rebaseline(self) -> None:
        """Take the listing again (after a case planted its own victims outside the scratch folder)."""
        self._before = self._now()

    def check(self) -> None:
        """Assert nothing outside `scratch` was created, changed or removed, and no payload ran."""
        after = self._now()
        changed = sorted(p for p in set(self._before) | set(after) if self._before.get(p) != after.get(p))
        assert not changed, f"files outside the scratch folder changed: {changed[:10]}"
        assert not self.pwned.exists(), "a payload ran"
