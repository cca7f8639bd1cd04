"""One exit-code table (musubi/contract/exits.py): distinct codes, used by every module, shown in the docs."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from musubi.contract import exits
from musubi.contract.exits import BY_CODE, EXITS

ROOT = Path(__file__).resolve().parents[2]
MUSUBI = ROOT / "musubi"

#: A number spelled where a process ends: `EXIT_X = 75`, `EXIT_A, EXIT_B = 0, 1`, sys.exit(1), os._exit(76),
#: typer.Exit(2), fail("...", 2), `self.code = 128 + signum`.
BARE_CODE = re.compile(r"^\s*EXIT_\w+(\s*,\s*EXIT_\w+)*\s*=\s*-?\d|(sys\.exit|os\._exit|typer\.Exit)\(\s*-?\d+\s*\)"
                       r"|\bfail\(.*,\s*\d+\)\s*$|128\s*\+\s*sig", re.MULTILINE)


def test_codes_and_names_are_distinct() -> None:
    assert len(BY_CODE) == len(EXITS)
    assert len({e.name for e in EXITS}) == len(EXITS)
    # The bug this table ended: a NaN's exit read as a hang (both were 76).
    assert exits.EXIT_NUMERICS != exits.EXIT_HANG
    assert all(e.meaning and e.used_by in ("rank", "command", "rank, command") for e in EXITS)
    constants = {v for k, v in vars(exits).items() if k.startswith("EXIT_")}
    assert constants == set(BY_CODE), "every EXIT_ constant has its row, every row its constant"


def test_restart_policy() -> None:
    # Recoveries of their own and crashes are restarted; bad input, a defect, a stop from outside are not.
    assert [c for c in (1, 75, 76, 78) if exits.restarted(c)] == [1, 75, 76, 78]
    assert not any(exits.restarted(c) for c in (0, 2, 3, 77, 130, 143))
    assert exits.restarted(-9)  # a SIGKILLed rank: torchrun restarts the job
    assert exits.FINAL_KINDS == {"config": exits.EXIT_CONFIG, "defect": exits.EXIT_DEFECT}
    assert all(not BY_CODE[c].restarted for c in exits.FINAL_KINDS.values())


def test_describe() -> None:
    assert exits.describe(-9) == "killed by SIGKILL"
    assert exits.describe(-200) == "killed by signal 200"
    assert exits.describe(exits.EXIT_NUMERICS) == "numerics" and exits.describe(exits.EXIT_HANG) == "hang"
    assert exits.describe(42) == "exit code 42"
    assert exits.after_signal(signal.SIGTERM) == exits.EXIT_TERMINATED == 143


def test_no_module_spells_an_exit_number() -> None:
    offenders = []
    for path in sorted(MUSUBI.rglob("*.py")):
        if path.name == "exits.py" and path.parent.name == "contract":
            continue
        text = path.read_text(encoding="utf-8")
        for m in BARE_CODE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0).strip()}")
    assert not offenders, "exit numbers belong in musubi/contract/exits.py; import the name:\n" + "\n".join(offenders)


def test_the_docs_table_shows_every_rank_code() -> None:
    page = (ROOT / "docs" / "reference" / "exit-codes.md").read_text(encoding="utf-8")
    rows = {int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", page, re.MULTILINE)}
    missing = [e.code for e in EXITS if "rank" in e.used_by and e.code not in rows]
    assert not missing, f"docs/reference/exit-codes.md has no row for rank exit(s) {missing}"
    for e in EXITS:  # every command code is named on the page (a table row or the fleet's steps paragraph)
        assert re.search(rf"\b{e.code}\b", page), e
