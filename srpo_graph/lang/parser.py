"""Parse ``.wf`` text into the syntax tree of :mod:`srpo_graph.lang.ast`.

Stage: lang (parse). Consumes source text (or a file's bytes), produces an
:class:`~srpo_graph.lang.ast.Module`. Knows the grammar (``srpo_graph/grammar/workflow.lark``,
loaded from the installed package so a wheel works) and nothing about names or types: those
are the checker's. Every Lark exception becomes a :class:`WorkflowSyntaxError` with a
``path:line:col``, the source line, a caret and, for common mistakes, a hint.
"""

from __future__ import annotations

import contextvars
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from srpo_graph.errors import Diagnostic, Span, WorkflowSyntaxError
from srpo_graph.lang import ast
from srpo_graph.lang.templates import decode_string, split_template

_comments: contextvars.ContextVar[list[Token]] = contextvars.ContextVar("wf_comments")


def grammar_text() -> str:
    """The grammar source, read from the installed package (works from a wheel)."""
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
        comments = tuple(ast.Comment(t.value.rstrip(), _tok_span(t, path)) for t in _comments.get())
    finally:
        _comments.reset(token)
    try:
        return _Build(path, text, comments).transform(tree)
    except VisitError as exc:  # a bad template or escape found while building nodes
        if isinstance(exc.orig_exc, WorkflowSyntaxError):
            raise exc.orig_exc from None
        raise


def read_source(path: str | Path) -> str:
    """Read a ``.wf`` file as UTF-8.

    Raises:
        WorkflowSyntaxError: the file is not UTF-8 (pointing at the first bad byte's line and
            column) or cannot be read.
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
    """Read (as UTF-8) and parse a ``.wf`` file; see :func:`parse`."""
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
        span = _tok_span(tok, path)
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


# --------------------------------------------------------------------------- building nodes


def _tok_span(tok: Token, path: str) -> Span:
    return Span(path=path, line=tok.line, col=tok.column, end_line=tok.end_line, end_col=tok.end_column)


class _Build(Transformer):
    """Lark tree -> AST nodes. Builds nodes and nothing else (no names resolved, no checks)."""

    def __init__(self, path: str, source: str, comments: tuple[ast.Comment, ...]):
        super().__init__()
        self.path, self.source, self.comments = path, source, comments

    def _span(self, meta) -> Span:
        if getattr(meta, "empty", True):
            return Span(path=self.path, line=1, col=1, end_line=1, end_col=1)
        return Span(path=self.path, line=meta.line, col=meta.column, end_line=meta.end_line, end_col=meta.end_column)

    def _name(self, tok: Token) -> ast.Name:
        return ast.Name(str(tok), _tok_span(tok, self.path))

    def _string(self, tok: Token) -> ast.StringLit:
        span = _tok_span(tok, self.path)
        triple = tok.value.startswith('"""')
        raw = tok.value[3:-3] if triple else tok.value[1:-1]
        return ast.StringLit(decode_string(raw, span, triple), span)

    # -- module ----------------------------------------------------------------
    @v_args(meta=True)
    def start(self, meta, children):
        header, *items = children
        return ast.Module(header, tuple(items), self.comments, self.source, self._span(meta))

    @v_args(meta=True)
    def header(self, meta, children):
        name, desc = children
        return ast.Header(self._name(name), self._string(desc) if desc is not None else None, self._span(meta))

    @v_args(meta=True)
    def import_stmt(self, meta, children):
        dotted, alias = children
        return ast.ImportStmt(dotted, self._name(alias) if alias is not None else None, self._span(meta))

    def dotted_name(self, children):
        return tuple(self._name(t) for t in children)

    @v_args(meta=True)
    def task_block(self, meta, children):
        return ast.TaskBlock(tuple(children), self._span(meta))

    @v_args(meta=True)
    def field_decl(self, meta, children):
        return ast.FieldDecl(self._name(children[0]), children[1], self._span(meta))

    @v_args(meta=True)
    def policy_decl(self, meta, children):
        return ast.PolicyDecl(self._name(children[0]), self._string(children[1]), self._span(meta))

    # -- agents ----------------------------------------------------------------
    @v_args(meta=True)
    def agent_decl(self, meta, children):
        return ast.AgentDecl(self._name(children[0]), tuple(children[1:]), self._span(meta))

    @v_args(meta=True)
    def policy_item(self, meta, children):
        return ast.PolicyItem(self._name(children[0]), self._span(meta))

    @v_args(meta=True)
    def prompt_item(self, meta, children):
        tok = children[0]
        span = _tok_span(tok, self.path)
        triple = tok.value.startswith('"""')
        raw = tok.value[3:-3] if triple else tok.value[1:-1]
        parts = split_template(raw, span, triple)
        return ast.PromptItem(ast.Template(parts, triple, span), self._span(meta))

    @v_args(meta=True)
    def sample_item(self, meta, children):
        return ast.SampleItem(tuple(children), self._span(meta))

    @v_args(meta=True)
    def sample_entry(self, meta, children):
        return ast.SampleEntry(self._name(children[0]), children[1], self._span(meta))

    @v_args(meta=True)
    def output_item(self, meta, children):
        return ast.OutputItem(children[0], children[1], self._span(meta))

    @v_args(meta=True)
    def unconsumed_item(self, meta, children):
        return ast.UnconsumedItem(self._name(children[0]), self._span(meta))

    # -- transitions ------------------------------------------------------------
    @v_args(meta=True)
    def transition_decl(self, meta, children):
        return ast.TransitionDecl(self._name(children[0]), tuple(children[1:]), self._span(meta))

    @v_args(meta=True)
    def consume_item(self, meta, children):
        return ast.ConsumeItem(children[0], self._span(meta))

    @v_args(meta=True)
    def tool_item(self, meta, children):
        return ast.ToolItem(self._name(children[0]), children[1], self._span(meta))

    @v_args(meta=True)
    def reward_item(self, meta, children):
        return ast.RewardItem(children[0], self._span(meta))

    @v_args(meta=True)
    def activate_item(self, meta, children):
        return ast.ActivateItem(children[0], self._span(meta))

    @v_args(meta=True)
    def max_rounds_item(self, meta, children):
        return ast.MaxRoundsItem(ast.NumberLit(int(children[0]), _tok_span(children[0], self.path)), self._span(meta))

    @v_args(meta=True)
    def activate_end(self, meta, children):
        return ast.ActivateEnd(self._span(meta))

    @v_args(meta=True)
    def activate_agents(self, meta, children):
        return ast.ActivateAgents(children[0], self._span(meta))

    @v_args(meta=True)
    def activate_route(self, meta, children):
        return ast.ActivateRoute(children[0], children[1], self._span(meta))

    def route_cases(self, children):
        return tuple(children)

    @v_args(meta=True)
    def route_case(self, meta, children):
        tok = children[0]
        label = tok.value[:-2].rstrip()
        span = Span(path=self.path, line=tok.line, col=tok.column, end_line=tok.line, end_col=tok.column + len(label))
        return ast.RouteCase(ast.Name(label, span), tuple(children[1:]), self._span(meta))

    def target(self, children):
        return self._name(children[0])

    # -- workflow-level ---------------------------------------------------------
    @v_args(meta=True)
    def start_stmt(self, meta, children):
        return ast.StartStmt(children[0], self._span(meta))

    @v_args(meta=True)
    def reward_stmt(self, meta, children):
        return ast.RewardStmt(children[0], self._span(meta))

    @v_args(meta=True)
    def max_steps_stmt(self, meta, children):
        return ast.MaxStepsStmt(ast.NumberLit(int(children[0]), _tok_span(children[0], self.path)), self._span(meta))

    def name_list(self, children):
        return tuple(self._name(t) for t in children)

    # -- types -------------------------------------------------------------------
    @v_args(meta=True)
    def text_type(self, meta, _):
        return ast.SimpleType("text", self._span(meta))

    @v_args(meta=True)
    def int_type(self, meta, _):
        return ast.SimpleType("int", self._span(meta))

    @v_args(meta=True)
    def float_type(self, meta, _):
        return ast.SimpleType("float", self._span(meta))

    @v_args(meta=True)
    def bool_type(self, meta, _):
        return ast.SimpleType("bool", self._span(meta))

    @v_args(meta=True)
    def choice_type(self, meta, children):
        return ast.ChoiceTypeExpr(children[0], False, self._span(meta))

    @v_args(meta=True)
    def choices_type(self, meta, children):
        return ast.ChoiceTypeExpr(children[0], True, self._span(meta))

    @v_args(meta=True)
    def list_type(self, meta, children):
        return ast.ListTypeExpr(children[0], self._span(meta))

    @v_args(meta=True)
    def record_type(self, meta, children):
        return ast.RecordTypeExpr(tuple(children), self._span(meta))

    @v_args(meta=True)
    def record_field(self, meta, children):
        return ast.RecordField(self._name(children[0]), children[1], self._span(meta))

    def label_list(self, children):
        return tuple(children)

    # -- calls and values ----------------------------------------------------------
    @v_args(meta=True)
    def call(self, meta, children):
        module, function, args = children
        return ast.Call(self._name(module), self._name(function), args or (), args is not None, self._span(meta))

    def call_args(self, children):
        return tuple(c for c in children if c is not None)

    @v_args(meta=True)
    def arg(self, meta, children):
        name, value = children
        return ast.Arg(self._name(name) if name is not None else None, value, self._span(meta))

    @v_args(meta=True)
    def ref(self, meta, children):
        optional = bool(children) and children[-1].type == "OPTIONAL"
        names = children[:-1] if optional else children
        return ast.Ref(tuple(str(t) for t in names), optional, self._span(meta))

    def string(self, children):
        return self._string(children[0])

    def signed_number(self, children):
        tok = children[0]
        text = tok.value
        value: int | float = float(text) if any(c in text for c in ".eE") else int(text)
        return ast.NumberLit(value, _tok_span(tok, self.path))

    @v_args(meta=True)
    def true(self, meta, _):
        return ast.BoolLit(True, self._span(meta))

    @v_args(meta=True)
    def false(self, meta, _):
        return ast.BoolLit(False, self._span(meta))

    @v_args(meta=True)
    def value_list(self, meta, children):
        return ast.ListLit(tuple(c for c in children if c is not None), self._span(meta))
