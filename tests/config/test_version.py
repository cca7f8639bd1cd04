"""The digest of Musubi's code: what a drill reference records beside the version (which stays 0.1.0)."""

import shutil
from pathlib import Path

import musubi
from musubi.config.version import source_digest


def test_the_digest_changes_with_any_source_edit_and_nothing_else(tmp_path: Path) -> None:
    here = Path(musubi.__file__).parent
    copy = tmp_path / "musubi"
    shutil.copytree(here, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert source_digest(copy) == source_digest() == source_digest(here)
    (copy / "config" / "stray.pyc").write_bytes(b"not a source")  # bytecode, caches: not the code
    (copy / "README.txt").write_text("notes")
    assert source_digest.__wrapped__(copy) == source_digest()
    target = copy / "config" / "version.py"
    target.write_text(target.read_text() + "\n# an edit\n")
    assert source_digest.__wrapped__(copy) != source_digest()
