"""The Python files a ``.wf`` file imports, read without running them.

Stage: lsp. Go to definition, hover and completion on ``alias.function`` need the module's file
and its functions, also when imports are off (the editor's default): the file is found the way
``check`` imports it (the ``.wf`` file's folder first, then ``sys.path``;
:func:`srpo_graph.lang.callables.python_module_name` maps ``std``) and read with Python's own
``ast`` -- nothing is imported, no code runs.
"""

from __future__ import annotations

import ast as pyast
import sys
from dataclasses import dataclass
from pathlib import Path

from srpo_graph.lang.callables import python_module_name


@dataclass(frozen=True)
class PyFunction:
    """A top-level ``def`` of a module file: where it is and what it says."""

    name: str
    path: Path
    line: int  # 1-based, the `def` line
    col: int  # 1-based, the function name
    signature: str  # `name(a: int, b: int) -> float`
    doc: str  # the docstring's first paragraph


def module_file(dotted: str, base_dir: Path | None) -> Path | None:
    """The file ``import dotted`` would load from ``base_dir`` or ``sys.path`` (None: not found).

    >>> module_file("std", None).name
    'std.py'
    """
    parts = python_module_name(dotted).split(".")
    roots = ([base_dir] if base_dir is not None else []) + [Path(p or ".") for p in sys.path]
    for root in roots:
        for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def functions(path: Path) -> dict[str, PyFunction]:
    """The top-level functions of a Python file, by name (an unreadable file has none).

    >>> fns = functions(module_file("std", None))
    >>> fns["equals"].signature
    'equals(a: int, b: int) -> float'
    """
    try:
        source = path.read_text(encoding="utf-8")
        tree = pyast.parse(source, filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return {}
    lines = source.splitlines()
    out = {}
    for node in tree.body:
        if isinstance(node, (pyast.FunctionDef, pyast.AsyncFunctionDef)) and not node.name.startswith("_"):
            text = lines[node.lineno - 1] if node.lineno <= len(lines) else ""
            col = text.find(node.name, text.find("def")) + 1
            ret = f" -> {pyast.unparse(node.returns)}" if node.returns is not None else ""
            sig = f"{node.name}({pyast.unparse(node.args)}){ret}"
            doc = (pyast.get_docstring(node) or "").split("\n\n")[0].replace("\n", " ")
            out[node.name] = PyFunction(node.name, path, node.lineno, max(col, 1), sig, doc)
    return out
