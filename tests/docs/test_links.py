"""The README is a door into docs/: every relative link in the project's markdown must land on a file and heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_LIMIT_BYTES = 12 * 1024  # the README stays a door, not the house

# [text](target) outside code; images too. Targets with a scheme (https:, mailto:) are not ours to check.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def markdown_files() -> list[Path]:
    """README.md, the other top-level notes and every page under docs/."""
    return sorted([*REPO.glob("*.md"), *(REPO / "docs").rglob("*.md")])


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `#` in a bash block is no heading, a link in one is no link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    """Every anchor of a markdown file, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The relative link targets of a markdown file (inline code spans removed first)."""
    found = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):
                found.append(target)
    return found


def broken_links(path: Path) -> list[str]:
    """Each link of `path` that names a missing file or a heading its file does not have."""
    bad = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            bad.append(f"{target}: no such heading")
    return bad


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    bad = broken_links(path)
    assert not bad, f"{path.relative_to(REPO)}: broken links:\n" + "\n".join(bad)


def test_link_checker_catches_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## Step 2: `musubi run`\n", encoding="utf-8")
    page.write_text(
        "# Page\n[ok](other.md#step-2-musubi-run) [self](#page) [web](https://example.com)\n"
        "```bash\n# not a heading [x](nowhere.md)\n```\n"
        "[gone](missing.md) [wrong](other.md#step-3)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == ["missing.md: no such file", "other.md#step-3: no such heading"]


def test_readme_stays_a_door() -> None:
    size = (REPO / "README.md").stat().st_size
    assert size <= README_LIMIT_BYTES, f"README.md is {size} bytes (> {README_LIMIT_BYTES}): move the detail into docs/"
