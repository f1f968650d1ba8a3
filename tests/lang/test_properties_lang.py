"""Property tests: grammar strings and mutated examples parse or raise WorkflowSyntaxError, never
anything else; a parsing mutant checks or raises WorkflowCheckError; the formatter round-trips."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark
from lark import Lark

from srpo_graph.errors import WorkflowCheckError, WorkflowSyntaxError
from srpo_graph.lang.checker import check
from srpo_graph.lang.fmt import format_source
from srpo_graph.lang.parser import grammar_text, parse

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "workflows").glob("*.wf"))]
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))

# from_lark needs the grammar without lexer callbacks; the keyword terminals make it generate
# real programs, and every generated string is valid for the grammar by construction.
_GEN = Lark(grammar_text(), parser="lalr", lexer="contextual")


@SETTINGS
@given(from_lark(_GEN, start="start"))
def test_grammar_strings_parse_or_raise_syntax_error(text: str) -> None:
    try:
        module = parse(text)
    except WorkflowSyntaxError as exc:
        assert exc.diagnostics and exc.diagnostics[0].span is not None
        return
    try:
        check(module, text)
    except WorkflowCheckError as exc:
        assert exc.diagnostics


@st.composite
def mutants(draw) -> str:
    text = draw(st.sampled_from(SOURCES))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(0, len(text) - 1)))
        op = draw(st.sampled_from(["delete", "insert", "swap"]))
        if op == "delete":
            text = text[:i] + text[i + 1 :]
        elif op == "insert":
            text = text[:i] + draw(st.sampled_from(list('{}[]()":,.?=->#\\\n x1'))) + text[i:]
        elif i + 1 < len(text):
            text = text[:i] + text[i + 1] + text[i] + text[i + 2 :]
    return text


@SETTINGS
@given(mutants())
def test_mutated_examples_never_crash(text: str) -> None:
    try:
        module = parse(text, "m.wf")
    except WorkflowSyntaxError as exc:
        assert str(exc).startswith("m.wf:")
        return
    try:
        check(module, text, base_dir=ROOT / "workflows")
    except WorkflowCheckError as exc:
        assert exc.diagnostics
    out = format_source(text)
    assert format_source(out) == out


def _shape(node):
    """A node as plain data without spans, comments or source text: what the formatter must keep. A
    field whose value is a span (a keyword's place, e.g. a policy's ``frozen``) keeps that it is
    there, not where: the formatter moves it."""
    import dataclasses

    from srpo_graph.lang.ast import Span

    if isinstance(node, Span):
        return "<span>"
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return (type(node).__name__,) + tuple(
            (f.name, _shape(getattr(node, f.name))) for f in dataclasses.fields(node)
            if f.name not in ("span", "comments", "source"))
    if isinstance(node, (tuple, list)):
        return tuple(_shape(x) for x in node)
    return node


@SETTINGS
@given(from_lark(_GEN, start="start"))
def test_formatting_keeps_the_tree_over_the_whole_grammar(text: str) -> None:
    """parse(fmt(x)) == parse(x), spans aside, for every string the grammar generates."""
    try:
        module = parse(text)
    except WorkflowSyntaxError:
        return
    out = format_source(text)
    assert _shape(parse(out)) == _shape(module)
    assert format_source(out) == out


def test_formatting_keeps_the_tree_of_every_example() -> None:
    for text in SOURCES:
        assert _shape(parse(format_source(text))) == _shape(parse(text))


def test_every_ast_construct_has_a_formatter_rule() -> None:
    """A construct added to the AST's unions without a rule in lang/fmt.py fails here, not as bad output."""
    import typing

    from srpo_graph.lang import ast, fmt

    tables = {ast.TypeExpr: fmt.TYPES, ast.Value: fmt.VALUES, ast.Expr: fmt.VALUES, ast.Activation: fmt.ACTIVATIONS,
              ast.AgentItem: fmt.AGENT_ITEMS, ast.TransitionItem: fmt.TRANSITION_ITEMS}
    for union, table in tables.items():
        missing = [c.__name__ for c in typing.get_args(union) if c not in table]
        assert not missing, f"no formatter rule for {missing}"
    blocks = {ast.TaskBlock, ast.AgentDecl, ast.TransitionDecl}
    assert [c.__name__ for c in typing.get_args(ast.Item) if c not in fmt.TOP_LINES and c not in blocks] == []


def test_an_unknown_construct_fails_loudly() -> None:
    import dataclasses

    import pytest

    from srpo_graph.lang import fmt

    m = parse('workflow w\nagent a {\n  policy: p\n}\n')
    agent = m.items[0]

    @dataclasses.dataclass(frozen=True)
    class NewItem:
        span: object

    weird = dataclasses.replace(agent, items=(*agent.items, NewItem(agent.items[0].span)))
    with pytest.raises(TypeError, match="no rule prints the agent item NewItem"):
        fmt.format_module(dataclasses.replace(m, items=(weird,)))
