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
