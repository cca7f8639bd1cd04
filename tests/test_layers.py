"""The package order is enforced: an import (top-level or inside a function) may only point down.

`LAYERS` lists the units of musubi lowest first; a unit is a folder (a package, or a subpackage
such as worker/feed that lower layers share), so the folder shows the layer; the longest matching
prefix decides. A module may import its own unit and any unit below it, never one above. No two
units import each other and no modules import each other in a circle (test_no_cycle_*). `KNOWN_BREACHES` lists the imports
that still point up, each with the reason; the test fails when one is added and when one is gone
(so the list only shrinks). Parsed with `ast`, so an import hidden in a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "musubi"

#: Lowest first. Launch and worker are two processes: neither imports the other (launch names the
#: worker module as a string); what both need lives below them (contract, checkpoint, recovery).
LAYERS: list[tuple[str, ...]] = [
    # The contract between processes: a rank's World and attempt, the torchrun entry, the fault-injection
    # switch (MUSUBI_INJECT), the run directory's paths, the MUSUBI_* names, the records that cross a
    # process boundary, the error type for bad input. It imports nothing else of musubi.
    ("musubi.contract",),
    ("musubi.config",),  # pydantic models and pure arithmetic (batch plan, LR rule): no torch
    ("musubi.topology",),
    ("musubi.plan",),
    ("musubi.store",),
    ("musubi.data",),
    ("musubi.tasks",),
    ("musubi.telemetry",),
    ("musubi.preflight",),
    ("musubi.checkpoint",),
    ("musubi.recovery",),
    ("musubi.evaluate",),
    ("musubi.records",),  # run evidence (logs, success criteria, comparison): the report quotes it
    ("musubi.diagnose",),
    ("musubi.worker.feed",),
    ("musubi.worker", "musubi.launch"),  # peers that must not import each other
    ("musubi.fleet",),
    ("musubi.api",),
    ("musubi", "musubi.cli"),  # musubi/__init__.py: the version and a lazy facade over musubi.api
]

#: Two processes: a module of one side never imports the other side's packages (subpackages included),
#: only what both share from the layers below them.
SIDES = ("musubi.launch", "musubi.worker")
SHARED = ("musubi.contract",)

#: (importing module, imported module) pairs that still break the order, and why they are left.
KNOWN_BREACHES: dict[tuple[str, str], str] = {}


def _unit_of(module: str) -> str:
    best = ""
    for layer in LAYERS:
        for unit in layer:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
                best = unit
    return best


def _rank(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def module_name(path: Path, root: Path) -> str:
    """`musubi.x.y` for ROOT/x/y.py (a package's `__init__` is the package)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """Every musubi module `source` imports, anywhere in it (relative imports resolved), with its line."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: None if is_package else -1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            # `from musubi.pkg import mod` imports musubi.pkg.mod where mod is a module
            found += [(f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target, node.lineno)
                      for a in node.names]
    return sorted(((m, line) for m, line in found if m == "musubi" or m.startswith("musubi.")), key=lambda x: x[1])


def _is_module(name: str) -> bool:
    p = ROOT.parent.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def breaches(module: str, imported: list[tuple[str, int]]) -> list[str]:
    """The imports of `module` that point to a higher layer or to a peer kept apart."""
    src = _unit_of(module)
    out = []
    for target, line in imported:
        dst = _unit_of(target)
        if not dst or dst == src:
            continue
        up = _rank(dst) > _rank(src)
        sides = [side for side in SIDES if src.startswith(side)], [side for side in SIDES if dst.startswith(side)]
        apart = all(sides) and sides[0] != sides[1] and dst not in SHARED
        if up or apart:
            out.append(f"{module}:{line} imports {target} ({src} may not import {dst})")
    return out


def _all_breaches() -> dict[tuple[str, str], str]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = module_name(path, ROOT)
        for line in breaches(module, imports_of(path.read_text(encoding="utf-8"), module,
                                                path.name == "__init__.py")):
            target = line.split(" imports ")[1].split(" ")[0]
            found[(module, target)] = line
    return found


def test_every_module_has_a_layer() -> None:
    missing = [module_name(p, ROOT) for p in ROOT.rglob("*.py") if not _unit_of(module_name(p, ROOT))]
    assert not missing, f"add these to LAYERS: {missing}"


def test_no_import_points_up() -> None:
    found = _all_breaches()
    new = [line for key, line in found.items() if key not in KNOWN_BREACHES]
    assert not new, "imports against the layer order:\n" + "\n".join(new)
    gone = [k for k in KNOWN_BREACHES if k not in found]
    assert not gone, f"fixed, remove from KNOWN_BREACHES: {gone}"


def test_a_forbidden_import_is_caught() -> None:
    """The checker itself: an upward import, top-level or inside a function, relative or absolute."""
    snippet = ("from musubi.config.job import JobSpec\n"
               "def f():\n    from musubi.worker.trainer import Trainer\n"
               "from ..worker.feed import loaders\n")
    found = breaches("musubi.launch.launch", imports_of(snippet, "musubi.launch.launch", False))
    assert len(found) == 2 and "musubi.worker.trainer" in found[0] and "musubi.worker.feed.loaders" in found[1], found
    assert breaches("musubi.config.job", imports_of("import musubi.store.db\n", "musubi.config.job", False))
    assert not breaches("musubi.launch.launch", imports_of("from ..contract import world\n", "musubi.launch.launch", False))
    assert not breaches("musubi.worker.trainer", imports_of("from musubi.checkpoint import saver\n",
                                                          "musubi.worker.trainer", False))


def test_every_unit_is_a_folder() -> None:
    """Each layer is folders, not single modules borrowed from another folder (musubi/api.py is the root's)."""
    loose = [u for layer in LAYERS for u in layer
             if not (ROOT.parent.joinpath(*u.split(".")) / "__init__.py").is_file() and u.count(".") != 1]
    assert not loose, f"a unit that is one module of a folder: move it to the folder of its layer: {loose}"


def import_graph() -> dict[str, set[str]]:
    """module -> the musubi modules it imports, anywhere in it (an import inside a function counts)."""
    sources = {module_name(p, ROOT): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        targets = set()
        for target, _ in imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
            while target and target not in sources:  # `from pkg import name`: the package's module
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of `graph` with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between units (LAYERS): which unit's modules import which other unit's."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        src = _unit_of(module)
        out.setdefault(src, set()).update(u for u in map(_unit_of, targets) if u and u != src)
    return out


def test_no_cycle_between_packages() -> None:
    found = circles(unit_graph(import_graph()))
    assert not found, f"packages that import each other (move the shared module to the folder of its layer): {found}"


def test_no_module_circle() -> None:
    found = circles(import_graph())
    assert not found, f"modules that import each other in a circle: {found}"


def test_a_planted_cycle_is_caught() -> None:
    """The cycle checkers themselves: a circle of three modules, and two packages that import each other."""
    graph = {"musubi.data.coco": {"musubi.data.pixels"}, "musubi.data.pixels": {"musubi.data.version"},
             "musubi.data.version": {"musubi.data.coco"}, "musubi.data.layout": {"musubi.data.coco"}}
    assert circles(graph) == [["musubi.data.coco", "musubi.data.pixels", "musubi.data.version"]]
    planted = {**import_graph(), "musubi.checkpoint.saver": {"musubi.worker.trainer"}}
    assert any({"musubi.checkpoint", "musubi.worker"} <= set(c) for c in circles(unit_graph(planted)))
    assert not circles({"a": {"b"}, "b": {"c"}})
