"""No private names across modules: what another module needs is public and documented."""

from __future__ import annotations

import ast

from tests.test_layers import ROOT, module_name


def private_imports(source: str) -> list[str]:
    """`from musubi.x import _name` anywhere in `source` (top level or inside a function)."""
    return [f"line {node.lineno}: from {node.module} import {a.name}"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("musubi"))
            for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]


def test_no_private_name_is_imported_across_modules() -> None:
    found = [f"{module_name(p, ROOT)} {line}" for p in sorted(ROOT.rglob("*.py"))
             for line in private_imports(p.read_text(encoding="utf-8"))]
    assert not found, "make these public (documented) or move them:\n" + "\n".join(found)


def test_the_checker_sees_a_private_import() -> None:
    snippet = "def f():\n    from musubi.recovery.goodput import _cause, failure_summary\nfrom .x import _y\n"
    assert len(private_imports(snippet)) == 2
    assert not private_imports("from torch.distributed.checkpoint import _async_process_executor\n")

