"""An `except` clause names only exceptions bound before its `try` starts.

`try: from m import E ... except E:` raises UnboundLocalError (or NameError) instead of handling
anything when the exception -- typically a Ctrl-C -- arrives while the import inside the `try` is
still running: the `except` clause is evaluated, and `E` was never bound. CI met exactly this in
`srpo-graph train` (a Ctrl-C in the first seconds printed an UnboundLocalError traceback). The rule
is checked over the whole package by reading its syntax trees.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
