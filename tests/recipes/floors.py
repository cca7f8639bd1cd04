"""The score each shipped CPU recipe is held to: the floor a slow-tier test asserts, the figure its file states.

A floor sits below what the recipe reached (bench/recipes.py measures it, the recipe's header and
docs/guides/train.md state it) by the margin seeds and thread counts move it, so a regression fails the test
and noise does not. Every held recipe states its figure in its own file; tests/recipes/test_stated.py checks
that, and names the test that holds each floor.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Floor:
    """One recipe's floor: the metric, the bar and the test that asserts it."""

    recipe: str  # the file that states it
    metric: str
    floor: float
    test: str  # where the slow tier asserts it (a shared launch where one exists)


FLOORS: dict[str, Floor] = {
    "classify-synthetic": Floor("examples/classify-synthetic.yaml", "top1", 0.9,
                                "tests/api/test_api.py::test_train_through_the_api_on_two_cpu_ranks"),
    "quickstart": Floor("docs/guides/quickstart.md", "top1", 0.95,
                        "tests/api/test_quickstart.py::test_readme_quickstart_runs_as_written"),
    "own-model": Floor("examples/own_model/job.yaml", "acc", 0.9,
                       "tests/tasks/test_own_model.py::test_the_example_reaches_its_floor"),
}
