"""Dataset version of a job: a content hash of what it trained on (for the registry)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

#: Synthetic-spec keys that change where samples are generated, not which samples.
_NOT_CONTENT = {"on_device"}


def _hash_file(h: Any, path: Path) -> None:
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def _hash_tree(h: Any, root: Path) -> None:
    """Names and sizes of every file under `root` (images are not read: a re-encode is a new version anyway)."""
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(root).as_posix()}:{p.stat().st_size};".encode())


def dataset_version(config: dict[str, Any]) -> str | None:
    """`synthetic-<sha256>` of the synthetic spec, `files-<sha256>` of annotations/text + image listings, or None.

    On-disk data hashes annotation JSON and text files byte for byte and image folders by
    relative name and size; None when the files are gone.
    """
    data = config.get("data") or {}
    synthetic = data.get("synthetic")
    if isinstance(synthetic, dict):
        fields = {k: v for k, v in synthetic.items() if k not in _NOT_CONTENT}
        fields["task"] = config.get("task")  # the same seed draws other samples for another task
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return "synthetic-" + hashlib.sha256(text.encode()).hexdigest()[:16]
    h = hashlib.sha256()
    try:
        for split in ("train", "val"):
            spec = data.get(split)
            if not isinstance(spec, dict):
                continue
            h.update(f"[{split}]".encode())
            path = Path(str(spec.get("path")))
            if path.is_file():
                _hash_file(h, path)
            elif path.is_dir():
                _hash_tree(h, path)
            else:
                return None
            if spec.get("annotations"):
                _hash_file(h, Path(spec["annotations"]))
    except OSError:
        return None
    h.update(f"image_size={data.get('image_size')};seq_len={data.get('seq_len')}".encode())
    return "files-" + h.hexdigest()[:16]
