"""Every located error of the checker has a `fix:` line (issue 22, item 4), as a class:

* structurally: every ``err(...)`` call of ``srpo_graph/lang`` (and every warning) passes a hint (a third positional
  argument that is not ``None``, or ``hint=``), and so does every ``sink.error(...)`` and every
  ``Diagnostic(...)`` the parser builds;
* behaviourally: every diagnostic of every golden bad file and of the cases below has one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from srpo_graph.errors import SrpoGraphError
from srpo_graph.lang import load_workflow

LANG = Path(__file__).resolve().parents[2] / "srpo_graph" / "lang"
GOLDEN = Path(__file__).parent / "golden"


def _calls():
    for path in sorted(LANG.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("err", "error", "warning")
            ):
                owner = ast.unparse(node.func.value)
                if node.func.attr == "err" or owner.endswith("sink"):
                    yield f"{path.name}:{node.lineno}", node
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Diagnostic":
                yield f"{path.name}:{node.lineno}", node  # Diagnostic(message, span, hint, ...)


@pytest.mark.parametrize("where, call", list(_calls()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_error_call_passes_a_fix(where, call):
    hint = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "hint"), None)
    assert hint is not None and not (isinstance(hint, ast.Constant) and not hint.value), f"{where}: no fix line"


@pytest.mark.parametrize("wf", sorted((GOLDEN / "bad").glob("*.wf")), ids=lambda p: p.stem)
def test_every_golden_error_has_a_fix_line(wf, monkeypatch):
    monkeypatch.chdir(GOLDEN)
    with pytest.raises(SrpoGraphError) as info:
        load_workflow(f"bad/{wf.name}")
    for d in info.value.diagnostics:
        if d.span is not None:
            assert d.hint, f"{wf.name}: {d.message}"
