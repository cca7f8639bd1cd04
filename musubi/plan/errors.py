"""The planner's one error type: bad input, said in one line that names the problem and the fix."""

from __future__ import annotations


class PlanError(ValueError):
    """Bad planner input (unknown GPU, layout that does not multiply to the GPU count, ...)."""
