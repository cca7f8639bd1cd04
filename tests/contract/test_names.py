"""The names that cross a process boundary are spelled in musubi/contract only.

A `MUSUBI_*` variable is named through musubi/contract/env.py, a run directory's file or folder
through musubi/contract/run_files.py (RUN_FILES). Parsed with `ast`: a docstring may mention a
name (it documents it); any other string constant may not. A folder name counts where it is a
path component: an operand of `/`, an argument of Path()/joinpath/os.path.join/with_name, compared
with a path's `.name`, or a part of a string with a slash and no space ("logs/rank0.log", not a
message such as "export/registration failed").
"""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

from musubi.contract import env
from musubi.contract.run_files import RUN_FILES, RunFiles
from tests.test_layers import ROOT, module_name

CONTRACT = ROOT / "contract"
ENV_NAME = re.compile(re.escape(env.VARIABLE_PREFIX) + r"[A-Z0-9_]*")
FOLDERS = frozenset(part for f in fields(RunFiles) for part in getattr(RUN_FILES, f.name).split("/")
                    if "." not in getattr(RUN_FILES, f.name))
FILES = frozenset(getattr(RUN_FILES, f.name) for f in fields(RunFiles) if "." in getattr(RUN_FILES, f.name))
PATH_CALLS = frozenset({"Path", "PurePath", "PurePosixPath", "joinpath", "join", "with_name"})
#: (module, folder) spelled outside the contract on purpose, and why.
NOT_RUN_DIRECTORY = {
    ("musubi.tasks.pretrained", "checkpoints"): "torch.hub's own cache folder ($TORCH_HOME/hub/checkpoints)",
}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function, or a bare string statement)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        out |= {id(st.value) for st in body
                if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str)}
    return out


def _strings(tree: ast.AST) -> list[ast.Constant]:
    skip = _docstrings(tree)
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def env_literals(source: str) -> list[str]:
    """`line: MUSUBI_X` for every string constant (not a docstring) that spells a Musubi variable."""
    return [f"line {n.lineno}: {m}" for n in _strings(ast.parse(source)) for m in ENV_NAME.findall(n.value)]


def _path_operands(tree: ast.AST) -> set[int]:
    """ids of the constants used as a path component: `/` operands, path-call arguments, `.name` comparisons."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            out |= {id(node.left), id(node.right)}
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in PATH_CALLS:
                out |= {id(a) for a in node.args}
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr in ("name", "stem") for s in sides):
                out |= {id(s) for s in sides}
    return out


def folder_literals(source: str, folders: frozenset[str] = FOLDERS) -> list[str]:
    """`line: 'text'` for every string constant that spells a run-directory folder as a path component."""
    tree = ast.parse(source)
    operands = _path_operands(tree)
    found = []
    for n in _strings(tree):
        parts = [p for p in re.split(r"[/\\]", n.value)]
        alone = n.value in folders and id(n) in operands
        in_path = len(parts) > 1 and not any(c.isspace() for c in n.value) and any(p in folders for p in parts)
        if alone or in_path:
            found.append(f"line {n.lineno}: {n.value!r}")
    return found


def _outside_contract() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*.py")) if CONTRACT not in p.parents]


def test_no_musubi_variable_is_spelled_outside_the_contract() -> None:
    found = [f"{module_name(p, ROOT)} {hit}" for p in _outside_contract()
             for hit in env_literals(p.read_text(encoding="utf-8"))]
    assert not found, "name these through musubi.contract.env:\n" + "\n".join(found)


def test_no_run_directory_folder_is_spelled_outside_the_contract() -> None:
    found = [f"{module_name(p, ROOT)} {hit}" for p in _outside_contract()
             for hit in folder_literals(p.read_text(encoding="utf-8"))
             if (module_name(p, ROOT), hit.split(": ", 1)[1].strip("'")) not in NOT_RUN_DIRECTORY]
    assert not found, "name these through RUN_FILES (musubi.contract.run_files):\n" + "\n".join(found)


def test_run_directory_files_are_named_in_one_place() -> None:
    """`"job.json"` and its siblings are spelled in musubi/contract/run_files.py only."""
    literals = {f'"{name}"' for name in FILES}
    found = [f"{module_name(p, ROOT)}: {lit}" for p in sorted(ROOT.rglob("*.py")) if p.name != "run_files.py"
             for lit in literals if lit in p.read_text(encoding="utf-8")]
    assert not found, "name these through RUN_FILES:\n" + "\n".join(found)


def test_every_variable_constant_is_named_as_it_reads() -> None:
    """`MUSUBI_CPUS = "MUSUBI_CPUS"`: grep for the variable finds its constant and every use."""
    names = {k: v for k, v in vars(env).items() if k.startswith(env.VARIABLE_PREFIX)}
    assert names and all(k == v for k, v in names.items()), names


def test_the_checkers_see_a_planted_name() -> None:
    """The checkers themselves: each planted spelling is caught, a docstring and an unrelated word are not."""
    planted = ('"""Reads MUSUBI_INJECT (documented here)."""\n'
               "import os\n"
               "def f(job_dir, p):\n"
               '    """Writes job_dir/logs."""\n'
               '    os.environ["MUSUBI_CPUS"] = "0-3"\n'
               '    a = job_dir / "logs" / "x.txt"\n'
               '    b = Path(job_dir, "checkpoints")\n'
               '    c = f"{job_dir}/telemetry/rank0.jsonl"\n'
               '    d = p.name != "memory"\n'
               '    e = {"memory": 1, "kind": "progress"}\n'
               '    return a, b, c, d, e, "logs"\n')
    assert env_literals(planted) == ["line 5: MUSUBI_CPUS"]
    assert [h.split(":")[0] for h in folder_literals(planted)] == ["line 6", "line 7", "line 8", "line 9"]
    assert folder_literals('x = "logs/rank0.log"\n') and not folder_literals('x = "no logs here"\n')
