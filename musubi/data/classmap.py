"""Class maps (`data.classes`): merge, rename and drop COCO categories as the annotations are read.

A map names source categories and what each becomes: another name (a rename, or a
merge when several map to one name, or to the name of a category left as it is)
or null (dropped: its boxes are removed and become background; the images stay).
Unlisted categories are kept. A resulting category keeps the smallest id of the
categories merged into it, so unmapped and renamed categories keep their ids and
predictions can be written in the file's own ids. The map is part of the job's
dataset version (musubi.data.job_version), so a changed map is a new version.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.data import guards

ClassMap = Mapping[str, "str | None"]


def apply_class_map(raw: dict[str, Any], classes: ClassMap, where: Path) -> dict[str, Any]:
    """A copy of the COCO dict `raw` (integer category ids, checked by the reader) with `classes` applied.

    ConfigError for a name the file does not have, an empty target name, or a map that drops every class.
    """
    cats = {c["id"]: c for c in raw["categories"]}
    names = {str(c.get("name", cid)) for cid, c in cats.items()}
    unknown = [k for k in classes if k not in names]
    if unknown:
        raise ConfigError(f"data.classes: {where} has no category {unknown[0]!r} (it has {', '.join(sorted(names))}); "
                          "fix the name or remove it from data.classes")
    for source, target in classes.items():
        if target is not None and not str(target).strip():
            raise ConfigError(f"data.classes: {source!r} maps to an empty name; give a name, or null to drop it")
    # Source id -> resulting name (None: dropped); resulting name -> the smallest id merged into it.
    target_of = {cid: classes.get(str(c.get("name", cid)), str(c.get("name", cid))) for cid, c in cats.items()}
    new_id: dict[str, int] = {}
    for cid in sorted(target_of):
        target = target_of[cid]
        if target is not None:
            new_id.setdefault(target, cid)
    if not new_id:
        raise ConfigError(f"data.classes: drops every category of {where}; keep at least one (map it to a name)")
    id_of = {cid: None if t is None else new_id[t] for cid, t in target_of.items()}
    categories = [{**cats[cid], "id": cid, "name": name} for name, cid in new_id.items()]
    annotations = []
    for a in raw["annotations"]:
        if isinstance(a, dict) and guards.is_id(a.get("category_id")) and a["category_id"] in id_of:
            if id_of[a["category_id"]] is None:
                continue  # a dropped class: its boxes are background now
            a = {**a, "category_id": id_of[a["category_id"]]}
        annotations.append(a)  # anything else is left for the reader's own checks to name
    return {**raw, "categories": categories, "annotations": annotations}
