"""What a check returns (status, what was found, the fix) and the report that collects them."""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text


class Status(str, enum.Enum):
    """Verdict of one check: PASS (fine), WARN (runs, but slower or riskier), FAIL (do not start)."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class CheckResult:
    """One line of the report: which check, its verdict, what it found and how to fix it."""

    check: str
    status: Status
    found: str
    fix: str = ""

    def line(self) -> str:
        """The result as one plain-text line: `STATUS check: found -> fix`."""
        text = f"{self.status.value} {self.check}: {self.found}"
        return f"{text} -> {self.fix}" if self.fix else text

    def to_dict(self) -> dict[str, str]:
        """The result as JSON-able fields."""
        return {"check": self.check, "status": self.status.value, "found": self.found, "fix": self.fix}


def passed(check: str, found: str) -> CheckResult:
    """A PASS result (no fix needed)."""
    return CheckResult(check, Status.PASS, found)


def warn(check: str, found: str, fix: str) -> CheckResult:
    """A WARN result: the run works, but slower or riskier than it should."""
    return CheckResult(check, Status.WARN, found, fix)


def fail(check: str, found: str, fix: str) -> CheckResult:
    """A FAIL result: starting the run would waste it."""
    return CheckResult(check, Status.FAIL, found, fix)


def jsonable(value: Any) -> Any:
    """Readings as JSON-able data (dataclasses, tuple-keyed dicts, paths, enums); a topology in env.json's form."""
    from musubi.topology.model import NodeTopology

    if isinstance(value, NodeTopology):
        return value.to_dict()  # NodeTopology.from_dict reads it back (one form in preflight.json and env.json)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {("-".join(map(str, k)) if isinstance(k, tuple) else str(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value


@dataclass
class PreflightReport:
    """Every result of one preflight, plus the readings they were judged on."""

    results: list[CheckResult]
    seconds: float = 0.0
    readings: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> list[CheckResult]:
        """The FAIL results (empty when the run may start)."""
        return [r for r in self.results if r.status is Status.FAIL]

    @property
    def warnings(self) -> list[CheckResult]:
        """The WARN results."""
        return [r for r in self.results if r.status is Status.WARN]

    @property
    def ok(self) -> bool:
        """True when no check failed."""
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (what RUN/preflight.json holds)."""
        counts = {s.value: sum(r.status is s for r in self.results) for s in Status}
        return {
            "ok": self.ok,
            "counts": counts,
            "seconds": round(self.seconds, 3),
            "results": [r.to_dict() for r in self.results],
            "readings": jsonable(self.readings),
        }

    def to_json(self) -> str:
        """The report as JSON text (what `musubi check --json` prints)."""
        return json.dumps(self.to_dict(), indent=1, default=str)


_STYLE = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


def render(report: PreflightReport, console: Console | None = None) -> None:
    """Print one coloured line per result, then a one-line summary."""
    console = console or Console(soft_wrap=True)
    for r in report.results:
        # Text, not markup: paths and values may hold '[' and must print verbatim.
        line = Text(f"{r.status.value:<4}", style=_STYLE[r.status])
        line.append(f" {r.check}: {r.found}")
        if r.fix:
            line.append(" -> ", style="dim")
            line.append(r.fix)
        console.print(line, highlight=False)
    n_fail, n_warn = len(report.failed), len(report.warnings)
    verdict = "FAILED" if n_fail else "passed"
    summary = Text(f"preflight {verdict}: {len(report.results)} checks, {n_fail} failed, {n_warn} warnings, "
                   f"{report.seconds:.1f} s", style=_STYLE[Status.FAIL] if n_fail else "bold")
    console.print(summary, highlight=False)
