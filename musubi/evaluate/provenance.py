"""Dataset version of a job: a content hash of what it trained on (for the registry)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

#: Synthetic-spec keys that change where samples are generated, not which samples.
_NOT_CONTENT = {"on_device"}


def split_files(data: dict[str, Any]) -> list[tuple[str, Path]] | None:
    """(name, file) of every on-disk split (annotations and every file under an image folder); None if gone."""
    from musubi.data.version import dataset_files

    files: list[tuple[str, Path]] = []
    for split in ("train", "val"):
        spec = data.get(split)
        if not isinstance(spec, dict):
            continue
        path = Path(str(spec.get("path")))
        if path.is_file():
            files.append((f"{split}/{path.name}", path))
        elif path.is_dir():
            files += [(f"{split}/{name}", p) for name, p in dataset_files(path)]
        else:
            return None
        if spec.get("annotations"):
            ann = Path(spec["annotations"])
            if not ann.is_file():
                return None
            files.append((f"{split}.annotations/{ann.name}", ann))
    return files


def dataset_version(config: dict[str, Any], store: Path | None = None) -> str | None:
    """`synthetic-<sha256>` of the synthetic spec, `data-<sha256>-<options>` of the files, or None.

    On-disk data is hashed byte for byte (annotations, text and every image, see
    musubi.data.version; digests cached in `store`), plus the options that change
    the samples (image_size, seq_len, slice); None when the files are gone.
    """
    data = config.get("data") or {}
    synthetic = data.get("synthetic")
    if isinstance(synthetic, dict):
        fields = {k: v for k, v in synthetic.items() if k not in _NOT_CONTENT}
        fields["task"] = config.get("task")  # the same seed draws other samples for another task
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return "synthetic-" + hashlib.sha256(text.encode()).hexdigest()[:16]
    from musubi.config.errors import ConfigError
    from musubi.data.version import hash_files

    files = split_files(data)
    if not files:
        return None
    # Options that change the samples drawn from the same files are part of the version.
    options = {k: data.get(k) for k in ("image_size", "seq_len", "slice")}
    try:
        digest = hash_files(files, store).version
    except ConfigError:
        return None
    return digest + "-" + hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:6]


def dataset_record(configs: list[dict[str, Any]], store: Path | None = None) -> dict[str, str | None]:
    """Job name -> dataset version of each resolved job config (env.json's `datasets`)."""
    return {str(c.get("name")): dataset_version(c, store) for c in configs if isinstance(c, dict)}
