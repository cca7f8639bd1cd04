"""Every example states what it reaches and on which machine; every held floor is stated where it is held."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO
from tests.recipes.floors import FLOORS

EXAMPLES = sorted([*(REPO / "examples").glob("*.yaml"), *(REPO / "examples").glob("*/job.yaml")])


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(REPO / "examples")) for p in EXAMPLES])
def test_every_example_states_its_score_time_and_machine(path) -> None:
    """A `# Reaches:` line in the header: the metric and time on a named machine, or why none is measured."""
    header = path.read_text(encoding="utf-8").split("\nname:", 1)[0]
    m = re.search(r"^# Reaches: (.+)$", header, re.M)
    assert m, f"{path.name}: state what it reaches in a '# Reaches:' header line (docs/guides/train.md, Examples)"
    said = m.group(1)
    assert re.search(r"\d", said) or "not measured" in said or "no score" in said, said


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_each_floor_is_stated_in_its_recipe_and_held_by_a_test_that_exists(name: str) -> None:
    floor = FLOORS[name]
    text = (REPO / floor.recipe).read_text(encoding="utf-8")
    assert f"floor {floor.floor:g}" in text and floor.metric in text, f"{floor.recipe} must state its floor"
    path, func = floor.test.split("::")
    assert f"def {func}(" in (REPO / path).read_text(encoding="utf-8"), floor.test
