"""One error system (issue 10, item 2): every error a user sees is a :class:`Diagnostic` of an
:class:`SrpoGraphError`, printed by :func:`errors.render`; no error message is formatted by hand."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from srpo_graph import errors
from srpo_graph.errors import ConfigError, Diagnostic, Span, SrpoGraphError, TraceError, render

PACKAGE = Path(errors.__file__).parent
# a hand-made rendering: "where: error: ...", or a line of its own starting "  fix:" / "  why:" / "  hint:"
HAND_MADE = re.compile(r": error: |(?:^|\n) *(?:fix|why|hint):")


def _error_class_names() -> set[str]:
    """Names of SrpoGraphError and of every subclass defined anywhere in the package."""
    names = {"SrpoGraphError"}
    trees = [ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in sorted(PACKAGE.rglob("*.py"))]
    grew = True
    while grew:  # subclasses of subclasses (e.g. BatchError(BackendError))
        grew = False
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name not in names and any(
                        _name(b) in names for b in node.bases):
                    names.add(node.name)
                    grew = True
    return names


def _name(node: ast.expr) -> str | None:
    """``X`` of ``X``, ``mod.X`` or ``X.at`` (the class a call builds an error of)."""
    if isinstance(node, ast.Attribute):
        return node.attr if node.attr != "at" else _name(node.value)
    return node.id if isinstance(node, ast.Name) else None


def _text(node: ast.expr) -> str | None:
    """The literal text of a string or f-string (each ``{...}`` as ``{}``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def hand_made_errors(source: str, filename: str, classes: set[str]) -> list[str]:
    """``file:line`` of every string passed to a call that builds one of ``classes`` and that
    looks like a rendered error (``: error: `` or a ``fix:``/``why:``/``hint:`` line)."""
    found = []
    for call in ast.walk(ast.parse(source, filename)):
        if not (isinstance(call, ast.Call) and _name(call.func) in classes):
            continue
        todo = [*call.args, *(k.value for k in call.keywords)]
        while todo:
            node = todo.pop()
            text = _text(node)
            if text is None:
                todo.extend(ast.iter_child_nodes(node))
            elif HAND_MADE.search(text):  # (an f-string's own parts are not looked at again)
                found.append(f"{filename}:{node.lineno}: {text[:70]!r}")
    return sorted(set(found))


def test_no_hand_formatted_error_messages():
    classes = _error_class_names()
    assert {"ConfigError", "TraceError", "BatchError", "RunStopped"} <= classes
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += hand_made_errors(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)), classes)
    assert not found, ("errors formatted by hand; build them with ErrorClass.at(where, message, why=..., fix=...):\n"
                       + "\n".join(found))


@pytest.mark.parametrize("snippet, bad", [
    ('raise ConfigError(f"{p}: error: no tasks")', True),
    ('raise ConfigError("x: error: y" + z)', True),
    ('raise errors.TraceError(f"bad\\n  fix: {hint}") from None', True),
    ('raise ConfigError("bad\\n"\n "  why: w")', True),
    ('return CompileError(f"x\\n  hint: {h}")', True),
    ('raise ConfigError.at(p, "x: error: y")', True),
    ('raise ConfigError.at(p, "no tasks", fix="give a task file")', False),
    ('raise ValueError(f"{p}: error: not ours")', False),
    ('"""a docstring: x.wf:1:2: error: y\n  fix: z"""', False),
    ('# raise ConfigError(f"{p}: error: a comment")', False),
])
def test_the_guard_sees_hand_made_errors(snippet, bad):
    assert bool(hand_made_errors(snippet, "s.py", {"ConfigError", "TraceError", "CompileError"})) is bad


def test_at_renders_where_why_and_fix():
    err = ConfigError.at("runs/x/config.toml", "field `optim.eps`: 1e-46 is too small",
                         why="Adam divides by sqrt(v) + eps", fix="use optim.eps >= 1.18e-38\nor the default")
    assert str(err) == ("runs/x/config.toml: error: field `optim.eps`: 1e-46 is too small\n"
                        "  why: Adam divides by sqrt(v) + eps\n"
                        "  fix: use optim.eps >= 1.18e-38\n"
                        "       or the default")
    assert isinstance(err, ConfigError) and err.exit_code == 7
    [diag] = err.diagnostics
    assert (diag.where, diag.why, diag.hint, diag.code) == ("runs/x/config.toml", "Adam divides by sqrt(v) + eps",
                                                            "use optim.eps >= 1.18e-38\nor the default", "E")
    assert str(TraceError.at("t.jsonl:3", "not valid JSON")) == "t.jsonl:3: error: not valid JSON"
    assert str(TraceError.at(None, "no place")) == "error: no place"


def test_at_with_a_span_shows_the_line():
    span = Span(path="w.wf", line=1, col=9, end_line=1, end_col=10)
    err = ConfigError.at(None, "unknown policy 'x'", span=span, fix="declared: tiny", source="policy: x")
    assert str(err) == "w.wf:1:9: error: unknown policy 'x'\n  1 | policy: x\n    |         ^\n  fix: declared: tiny"


def test_several_diagnostics_render_with_a_limit():
    diags = [Diagnostic(f"field `f{i}`: bad", where="<config>", hint="fix it") for i in range(7)]
    text = str(ConfigError(render(diags, limit=5), diagnostics=diags))
    assert text.splitlines()[:2] == ["<config>: error: field `f0`: bad", "  fix: fix it"]
    assert text.splitlines()[-1] == "... and 2 more" and text.count(": error: ") == 5
    assert str(ConfigError(diagnostics=diags[:2])) == render(diags[:2])


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def test_every_error_class_has_an_exit_code():
    in_errors = [c for c in _subclasses(SrpoGraphError) if c.__module__ == "srpo_graph.errors"]
    assert len(in_errors) >= 7
    for cls in [SrpoGraphError, *in_errors]:
        assert cls.exit_code in errors.EXIT_CODES, f"{cls.__name__}: exit code {cls.exit_code} not in EXIT_CODES"


def test_exit_codes_table_lists_every_code_and_class():
    table = errors.exit_codes_table()
    rows = table.splitlines()[2:]
    assert [int(r.split("|")[1]) for r in rows] == sorted(errors.EXIT_CODES)
    for cls in _subclasses(SrpoGraphError):
        if cls.__module__ == "srpo_graph.errors" and cls.exit_code != SrpoGraphError.exit_code:
            row = next(r for r in rows if r.startswith(f"| {cls.exit_code} |"))
            assert errors.EXIT_CODES[cls.exit_code] in row
            # classes sharing a code (2: both .wf errors) share one row, named after one of them
            sharing = [c.__name__ for c in _subclasses(SrpoGraphError)
                       if c.__module__ == "srpo_graph.errors" and c.exit_code == cls.exit_code]
            assert any(f"`{name}`" in row for name in sharing), row
