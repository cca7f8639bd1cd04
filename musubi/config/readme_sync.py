"""Rewrite the configuration reference (docs/reference/config.md) from the models: `python -m musubi.config.readme_sync`."""

from __future__ import annotations

from pathlib import Path

from musubi.config.schema_doc import reference_markdown

#: The generated page, relative to the repository root.
REFERENCE = Path("docs") / "reference" / "config.md"


def sync(page: Path) -> None:
    """Write the current reference page (the whole file is generated)."""
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(reference_markdown(), encoding="utf-8")


if __name__ == "__main__":
    sync(Path(__file__).resolve().parents[2] / REFERENCE)
