"""Parse ``.wf`` text into the syntax tree of :mod:`srpo_graph.lang.ast`.

Stage: lang (parse). Consumes source text (or a file's bytes), produces an
:class:`~srpo_graph.lang.ast.Module`. Knows the grammar (``srpo_graph/grammar/workflow.lark``,
loaded from the installed package so a wheel works) and nothing about names or types: those
are the checker's; the tree -> AST step is :mod:`srpo_graph.lang.build`. Every Lark exception
becomes a :class:`WorkflowSyntaxError` with a ``path:line:col``, the source line, a caret and,
for common mistakes, a hint.
"""

from __future__ import annotations

import contextvars
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from srpo_graph.errors import Diagnostic, Span, WorkflowSyntaxError
from srpo_graph.lang import ast
from srpo_graph.lang.build import BuildAst, tok_span

_comments: contextvars.ContextVar[list[Token]] = contextvars.ContextVar("wf_comments")


def grammar_text() -> str:
    """The grammar source, read from the installed package (works from a wheel).

    Returns:
        The Lark grammar text of ``srpo_graph/grammar/workflow.lark``.

    >>> "workflow" in grammar_text()
    True
    """
    return resources.files("srpo_graph").joinpath("grammar/workflow.lark").read_text(encoding="utf-8")


def _on_comment(tok: Token) -> Token:
    _comments.get().append(tok)
    return tok


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": _on_comment},
    )


def parse(text: str, path: str = "<string>") -> ast.Module:
    """Parse ``.wf`` source text.

    Args:
        text: the source.
        path: the file name used in spans and error messages.

    Returns:
        The :class:`~srpo_graph.lang.ast.Module`.

    Raises:
        WorkflowSyntaxError: the text does not match the grammar (one diagnostic, pointed).

    >>> m = parse('workflow w "demo"\\npolicy tiny = "tiny"')
    >>> m.header.name.value, m.items[0].model.value
    ('w', 'tiny')
    """
    token = _comments.set([])
    try:
        try:
            tree = _lark().parse(text)
        except UnexpectedInput as exc:
            raise _syntax_error(exc, text, path) from None
        comments = tuple(ast.Comment(t.value.rstrip(), tok_span(t, path)) for t in _comments.get())
    finally:
        _comments.reset(token)
    try:
        return BuildAst(path, text, comments).transform(tree)
    except VisitError as exc:  # a bad template or escape found while building nodes
        if isinstance(exc.orig_exc, WorkflowSyntaxError):
            raise exc.orig_exc from None
        raise


def read_source(path: str | Path) -> str:
    """Read a ``.wf`` file as UTF-8.

    Args:
        path: the file.

    Returns:
        Its text.

    Raises:
        WorkflowSyntaxError: the file is not UTF-8 (pointing at the first bad byte's line and
            column) or cannot be read.

    >>> read_source("/no/such/file.wf")
    Traceback (most recent call last):
    srpo_graph.errors.WorkflowSyntaxError: /no/such/file.wf: error: cannot read the file: No such file or directory
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise WorkflowSyntaxError(f"{p}: error: cannot read the file: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        span = Span(path=str(p), line=line, col=col, end_line=line, end_col=col + 1)
        diag = Diagnostic(
            f"the file is not UTF-8: byte 0x{data[exc.start]:02x} cannot be decoded",
            span,
            "save the file as UTF-8",
            code="not-utf8",
        )
        raise WorkflowSyntaxError(diagnostics=[diag], source="") from None


def parse_file(path: str | Path) -> ast.Module:
    """Read (as UTF-8) and parse a ``.wf`` file.

    Args:
        path: the file.

    Returns:
        The :class:`~srpo_graph.lang.ast.Module`, its spans pointing into ``path``.

    Raises:
        WorkflowSyntaxError: the file cannot be read, is not UTF-8 or does not parse.

    >>> parse_file("/no/such/file.wf")
    Traceback (most recent call last):
    srpo_graph.errors.WorkflowSyntaxError: /no/such/file.wf: error: cannot read the file: No such file or directory
    """
    return parse(read_source(path), str(path))


# --------------------------------------------------------------------------- errors

_FRIENDLY = {
    "$END": "end of file", "LBRACE": "'{'", "RBRACE": "'}'", "COLON": "':'", "COMMA": "','",
    "LSQB": "'['", "RSQB": "']'", "LPAR": "'('", "RPAR": "')'", "DOT": "'.'", "EQUAL": "'='",
    "OPTIONAL": "'?'", "NAME": "a name", "STRING": "a string", "LONG_STRING": 'a """string"""',
    "INT": "an integer", "SIGNED_NUMBER": "a number", "END": "'end'", "CASE_LABEL": "a case 'label ->'",
}

# Common mistakes, recognized by the parser state they fail in (Lark's match_examples).
_EXAMPLES: dict[tuple[str, str | None], list[str]] = {
    ("missing ':' after a field name", "fields are written `name: value`, e.g. `policy: tiny`"): [
        "workflow w agent a { policy tiny }",
        'workflow w agent a { prompt "x" }',
        "workflow w agent a { output int }",
        "workflow w agent a { unconsumed allow }",
        "workflow w transition t { consume a }",
        "workflow w transition t { activate end }",
        "workflow w transition t { max_rounds 3 }",
        "workflow w transition t { reward std.f }",
        "workflow w start a",
        "workflow w max_steps 3",
        "workflow w reward std.f",
        "workflow w task { x int }",
        "workflow w agent a { sample { temperature 1.0 } }",
    ],
    ("a block is not closed", "add the missing '}'"): [
        "workflow w agent a { policy: p",
        "workflow w agent a { policy: p agent b {",
        "workflow w agent a { policy: p transition t {",
        "workflow w agent a { policy: p start: a",
        "workflow w transition t { consume: a",
        "workflow w transition t { consume: a agent b {",
        "workflow w transition t { consume: a transition u {",
        "workflow w transition t { activate: end transition u {",
        "workflow w transition t { activate: end agent b {",
        "workflow w transition t { activate: end start: a",
        "workflow w task { x: int",
        "workflow w task { x: int agent a {",
        "workflow w agent a { sample { max_tokens: 1 ",
    ],
    ("a workflow file starts with `workflow NAME`", 'add a first line like `workflow my_flow "what it does"`'): [
        "agent a {", "import std", "policy p = \"x\"", "task {", "transition t {",
    ],
}


@lru_cache(maxsize=1)
def _compiled_examples() -> dict:
    """Each example in four variants: Lark compares parser states including the stack depth,
    which differs when an item (or a block's item) precedes the mistake."""
    out = {}
    for key, examples in _EXAMPLES.items():
        variants = []
        for ex in examples:
            rest = ex[len("workflow w"):] if ex.startswith("workflow w") else None
            if rest is None:
                variants.append(ex)
                continue
            for pre in ("", " import std"):
                variants.append("workflow w" + pre + rest)
                for head, inner in (("{ ", "{ policy: p "), ("transition t { ", "transition t { consume: a ")):
                    if head in rest and (head != "{ " or "agent a { " in rest):
                        variants.append("workflow w" + pre + rest.replace(head, inner, 1))
        out[key] = variants
    return out


def _describe(token_type: str) -> str:
    if token_type in _FRIENDLY:
        return _FRIENDLY[token_type]
    if token_type.startswith("__ANON"):
        return "a symbol"
    return f"'{token_type.lower()}'"


def _syntax_error(exc: UnexpectedInput, text: str, path: str) -> WorkflowSyntaxError:
    line, col = max(exc.line, 1), max(exc.column, 1)
    hint = None
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        if char == '"':
            end = text.find("\n", exc.pos_in_stream)
            end = len(text) if end < 0 else end
            message = "unterminated string"
            hint = 'close the string with `"` on the same line, or use """triple quotes""" for several lines'
            span = Span(path=path, line=line, col=col, end_line=line, end_col=col + max(1, end - exc.pos_in_stream))
            return WorkflowSyntaxError(diagnostics=[Diagnostic(message, span, hint, code="bad-string")], source=text)
        message = f"unexpected character {char!r}"
        span = Span(path=path, line=line, col=col, end_line=line, end_col=col + 1)
        expected = sorted({_describe(t) for t in exc.allowed or ()})
        if expected:
            hint = "expected " + ", ".join(expected)
        return WorkflowSyntaxError(diagnostics=[Diagnostic(message, span, hint, code="syntax")], source=text)

    assert isinstance(exc, UnexpectedToken)
    tok = exc.token
    label = None
    try:
        label = exc.match_examples(_lark().parse, _compiled_examples(), use_accepts=True)
    except UnexpectedInput:  # match_examples re-parses the examples; never let it hide the real error
        label = None
    opened = _unclosed_brace(text[: tok.start_pos] if tok.type != "$END" else text)
    if opened is not None and tok.type in _TOP_KEYWORDS:  # a top-level item inside a block
        label = _EXAMPLES_KEYS[1]
    if tok.type == "$END":
        found = "end of file"
        span = Span(path=path, line=line, col=col, end_line=line, end_col=col + 1)
        if label is None:
            label = _EXAMPLES_KEYS[1]
    else:
        found = f"{_describe(tok.type)} {tok.value!r}" if tok.type in ("NAME", "STRING", "INT", "SIGNED_NUMBER") \
            else repr(str(tok.value))
        span = tok_span(tok, path)
    expected = sorted({_describe(t) for t in exc.expected})
    if label is not None:
        message = f"{label[0]} (found {found})"
        hint = label[1]
        if label is _EXAMPLES_KEYS[1]:
            if opened is not None:
                hint = f"the '{{' on line {opened[0]}, column {opened[1]} is never closed: add '}}'"
    else:
        message = f"unexpected {found}"
        hint = "expected " + ", ".join(expected) if expected else None
    code = "unclosed-block" if label is _EXAMPLES_KEYS[1] else "syntax"
    return WorkflowSyntaxError(diagnostics=[Diagnostic(message, span, hint, code=code)], source=text)


_EXAMPLES_KEYS = list(_EXAMPLES)
_TOP_KEYWORDS = {"$END", "AGENT", "TRANSITION", "TASK", "IMPORT", "START", "MAX_STEPS", "WORKFLOW"}

_SCAN = re.compile(r'"""(?:[^"\\]|\\.|"(?!""))*"""|"(?:[^"\\\n]|\\.)*"|#[^\n]*|[{}]|\n', re.S)


def _unclosed_brace(text: str) -> tuple[int, int] | None:
    """The line and column of the innermost '{' never closed (strings and comments skipped)."""
    stack: list[tuple[int, int]] = []
    line, line_start = 1, 0
    for m in _SCAN.finditer(text):
        s = m.group()
        if s == "{":
            stack.append((line, m.start() - line_start + 1))
        elif s == "}":
            if stack:
                stack.pop()
        newlines = s.count("\n")
        if newlines:
            line += newlines
            line_start = m.start() + s.rfind("\n") + 1
    return stack[-1] if stack else None
