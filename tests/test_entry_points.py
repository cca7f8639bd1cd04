"""Entry points stay short: no function a process starts from, nor a phase of the rank, nor a CLI command body,
is over MAX_LINES (issue 44; torchtitan's train.py reads as build -> train -> close).

Which functions count, found from the code (not a list to keep up to date):
- every function and method of a module run as a program (`if __name__ == "__main__":`);
- every function and method of the rank's phases (musubi/worker/rank.py), and the launcher's entry
  (`launch_train`, wherever it lives);
- every CLI command body: a function under `@<app>.command(...)`/`@<app>.callback(...)`, or registered
  as `<app>.command(...)(module.function)`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

MAX_LINES = 60
PACKAGE = REPO / "musubi"
#: The rank's phases: every method counts.
PHASE_MODULES = ("musubi/worker/rank.py",)
#: Entries named wherever they live.
NAMED_ENTRIES = ("launch_train",)
#: Entries allowed over the bar for now ('path::name' -> lines): their length may only shrink; an entry at or
#: under MAX_LINES must leave the list. Empty: every entry is short.
ALLOWED: dict[str, int] = {}

Func = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(tree: ast.AST) -> list[Func]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _lines(fn: Func) -> int:
    return (fn.end_lineno or fn.lineno) - fn.lineno + 1


def _is_command(decorator: ast.expr) -> bool:
    """`@app.command(...)`, `@data_app.command`, `@app.callback()`."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr in ("command", "callback")


def _registered_commands(tree: ast.AST) -> set[str]:
    """Names of functions registered as `app.command(...)(module.function)` or `app.command(...)(function)`."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Call) and _is_command(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Attribute):
                out.add(arg.attr)
            elif isinstance(arg, ast.Name):
                out.add(arg.id)
    return out


def entry_functions() -> dict[str, int]:
    """'path::name' -> lines, for every function that counts as an entry (see the module docstring)."""
    trees = {p.relative_to(REPO).as_posix(): ast.parse(p.read_text(encoding="utf-8"))
             for p in sorted(PACKAGE.rglob("*.py"))}
    registered = set().union(*(_registered_commands(t) for t in trees.values()))
    found: dict[str, int] = {}
    for path, tree in trees.items():
        program = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
        for fn in _functions(tree):
            command = any(_is_command(d) for d in fn.decorator_list)
            # a registered name counts only at module level (a method of the same name is another function)
            top = fn in tree.body
            if (program or path in PHASE_MODULES or command or fn.name in NAMED_ENTRIES
                    or (top and fn.name in registered)):
                found[f"{path}::{fn.name}"] = max(found.get(f"{path}::{fn.name}", 0), _lines(fn))
    return found


def test_no_entry_function_is_over_the_bar() -> None:
    found = entry_functions()
    assert "musubi/worker/worker.py::main" in found and "musubi/worker/rank.py::setup" in found, sorted(found)
    assert any(k.endswith("::launch_train") for k in found), "the launcher's entry launch_train was not found"
    long = {k: n for k, n in found.items() if n > MAX_LINES and not (k in ALLOWED and n <= ALLOWED[k])}
    assert not long, f"entry functions over {MAX_LINES} lines (split them into named phases): {long}"
    done = [k for k, n in ALLOWED.items() if found.get(k, 0) <= MAX_LINES]
    assert not done, f"at or under {MAX_LINES} lines now (or gone): remove from ALLOWED: {done}"


def test_the_checker_finds_every_kind_of_entry() -> None:
    """The finder itself: a program's function, a decorated command, a registered command."""
    src = ("import typer\napp = typer.Typer()\n\n@app.command()\ndef train():\n    pass\n\n"
           "def helper():\n    pass\n\napp.command('x')(mod.body)\n")
    tree = ast.parse(src)
    commands = [fn.name for fn in _functions(tree) if any(_is_command(d) for d in fn.decorator_list)]
    assert commands == ["train"]
    assert _registered_commands(tree) == {"body"}
    assert _lines(_functions(ast.parse("def f():\n" + "    x = 1\n" * 70))[0]) == 71
    assert isinstance(Path(PHASE_MODULES[0]), Path) and (REPO / PHASE_MODULES[0]).is_file()
