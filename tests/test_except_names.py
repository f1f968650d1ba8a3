"""An `except` clause names only exceptions bound before its `try` starts.

`try: from m import E ... except E:` raises UnboundLocalError (or NameError) instead of handling
anything when the exception -- typically a Ctrl-C -- arrives while the import inside the `try` is
still running: the `except` clause is evaluated, and `E` was never bound. CI met exactly this in
`srpo-graph train` (a Ctrl-C in the first seconds printed an UnboundLocalError traceback). The rule
is checked over the whole package by reading its syntax trees.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import srpo_graph

PACKAGE = Path(srpo_graph.__file__).parent


def _bound_by_imports(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _handler_names(handler: ast.ExceptHandler) -> set[str]:
    if handler.type is None:
        return set()
    return {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)}


def late_bound_handlers(source: str, filename: str = "<string>") -> list[str]:
    """`file:line: name` for every except clause naming an exception imported inside its own try."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Try | ast.TryStar):
            inside = _bound_by_imports(node.body)
            for handler in node.handlers:
                for name in sorted(_handler_names(handler) & inside):
                    found.append(f"{filename}:{handler.lineno}: {name}")
    return found


def test_the_rule_finds_a_planted_case() -> None:
    planted = "def f():\n    try:\n        from m import E\n        g()\n    except E:\n        pass\n"
    assert late_bound_handlers(planted) == ["<string>:5: E"]
    fine = "def f():\n    from m import E\n    try:\n        g()\n    except E:\n        pass\n"
    assert late_bound_handlers(fine) == []


def test_no_except_clause_names_an_exception_imported_inside_its_try() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += late_bound_handlers(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    assert not found, "import the exception before the try (or catch its base class):\n" + "\n".join(found)


# Note [A Ctrl-C handler imports no torch] (srpo_graph/train/stops.py): a Ctrl-C can land inside the
# process's first `import torch`; a handler that then imports torch again dies (exit 139) instead of
# saying "interrupted". So what a Ctrl-C handler imports must not import torch. (The rule reads the
# imports written in the handlers themselves, not those of the functions they call.)
def handler_imports(source: str) -> set[str]:
    """The modules imported inside every `except` clause that catches KeyboardInterrupt
    (``from pkg import name``: ``pkg``, and ``pkg.name`` too, which is a module if it can be found)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ExceptHandler) and "KeyboardInterrupt" in _handler_names(node):
            for stmt in node.body:
                for sub in ast.walk(stmt):
                    if isinstance(sub, ast.ImportFrom) and sub.module and not sub.level:
                        found.add(sub.module)
                        found.update(f"{sub.module}.{a.name}" for a in sub.names)
                    elif isinstance(sub, ast.Import):
                        found.update(a.name for a in sub.names)
    return found


def test_the_handler_rule_finds_a_planted_case() -> None:
    planted = ("def f():\n    try:\n        g()\n    except KeyboardInterrupt:\n"
               "        from srpo_graph.train.checkpoint import layout\n        import json\n")
    assert handler_imports(planted) == {"srpo_graph.train.checkpoint", "srpo_graph.train.checkpoint.layout", "json"}
    assert handler_imports("try:\n    g()\nexcept ValueError:\n    import torch\n") == set()


@pytest.mark.proc
def test_no_ctrl_c_handler_imports_torch() -> None:
    """Every module a Ctrl-C handler of the package imports, imported in order in a fresh interpreter:
    none of them loads torch (the first that does is named)."""
    modules = sorted(set().union(*(handler_imports(p.read_text(encoding="utf-8")) for p in PACKAGE.rglob("*.py"))))
    assert "srpo_graph.train.stops" in modules  # train's handler: the case CI met
    probe = ("import importlib, importlib.util, sys\n"
             f"for m in {modules!r}:\n"
             "    try:\n"
             "        found = importlib.util.find_spec(m) is not None\n"
             "    except ModuleNotFoundError:  # pkg.name where name is not a module\n"
             "        found = False\n"
             "    if found:\n"
             "        importlib.import_module(m)\n"
             "    if 'torch' in sys.modules:\n"
             "        sys.exit(m)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)  # the checkout whose sources were read
    assert proc.returncode == 0, f"a Ctrl-C handler imports a module that imports torch: {proc.stderr.strip()}"
