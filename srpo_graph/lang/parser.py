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
from typing import cast

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from srpo_graph.errors import MAX_REPORTED, Diagnostic, Span, WorkflowSyntaxError
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
    if text.startswith("\ufeff"):
        span = Span(path=path, line=1, col=1, end_line=1, end_col=2)
        raise WorkflowSyntaxError(diagnostics=[Diagnostic(
            "the file starts with a byte-order mark (BOM, U+FEFF)", span,
            "save the file as UTF-8 without a BOM", code="bom")], source=text)
    # A line ends at \n, \r\n or a lone \r, for the lexer as for the error printer
    # (errors.source_lines): an old-Mac file gets real line numbers, a CRLF file the same columns.
    lexed = text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
    token = _comments.set([])
    try:
        try:
            tree = _lark().parse(lexed)
        except UnexpectedInput as exc:
            raise _recover(_syntax_error(exc, lexed, path), lexed, path) from None
        comments = tuple(ast.Comment(t.value.rstrip(), tok_span(t, path)) for t in _comments.get())
    finally:
        _comments.reset(token)
    _check_nesting(tree, lexed, path)
    builder = BuildAst(path, text, comments)
    try:
        module = builder.transform(tree)
        if builder.problems:  # every bad literal of the file, in source order
            order = sorted(builder.problems, key=lambda d: (d.span.line, d.span.col) if d.span else (0, 0))
            raise WorkflowSyntaxError(diagnostics=order, source=lexed)
        return module
    except VisitError as exc:  # a bad template, escape or number found while building nodes
        orig = exc.orig_exc
        if isinstance(orig, WorkflowSyntaxError):
            if orig.diagnostics and orig.source is None:  # render it against this text, not the file
                raise WorkflowSyntaxError(diagnostics=orig.diagnostics, source=lexed) from None
            raise orig from None
        raise


# Note [Syntax error recovery]
# Top-level items start with a keyword at the start of a line (the formatter's layout). After a
# syntax error, the item holding it is blanked (its lines kept empty, so positions stay true) and
# the rest is parsed again: one error per broken item, several items at once, never a follow-on
# error of the same item. An error in the header, or one not inside an item, ends the recovery.
_ITEM_START = re.compile(r"^(import|task|policy|agent|transition|start|reward|max_steps)\b")


def _recover(first: WorkflowSyntaxError, text: str, path: str) -> WorkflowSyntaxError:
    """``first`` with the syntax errors of the other broken top-level items added (Note above)."""
    diagnostics = list(first.diagnostics)
    lines = text.split("\n")
    current = list(lines)
    err = first
    recovered: str | None = None  # the text with the broken items blanked, once it parses
    for _ in range(MAX_REPORTED):
        spans = [d.span for d in err.diagnostics if d.span is not None]
        if not spans:
            break
        at = spans[0].line - 1
        starts = [i for i, line in enumerate(current) if _ITEM_START.match(line)]
        if at in starts and spans[0].col == 1:  # found at an item's keyword: the item before it is broken
            begin, end = max((i for i in starts if i < at), default=None), at
        else:
            begin = max((i for i in starts if i <= at), default=None)
            end = min((i for i in starts if i > at), default=len(current))
        if begin is None:  # in the header or before the first item: nothing to skip to
            break
        if begin < at < end and _is_whole_line(current[at]):
            # inside an item, on a line that opens and closes nothing: skip that line only, so a
            # second mistake of the same item is reported too (an agent's `policy p`, `prompt "x"`)
            begin, end = at, at + 1
        current[begin:end] = [""] * (end - begin)
        try:
            _lark().parse("\n".join(current))
            recovered = "\n".join(current)
            break
        except UnexpectedInput as exc:
            err = _syntax_error(exc, "\n".join(current), path)
            seen = {(d.message, d.hint) for d in diagnostics}
            new = [d for d in err.diagnostics if d.span is not None and d.span.line - 1 >= end
                   and (d.message, d.hint) not in seen]
            if not new:  # an error the blanking itself caused (e.g. a lone `}`): stop here
                break
            diagnostics.extend(new)
    out = first if len(diagnostics) == len(first.diagnostics) else WorkflowSyntaxError(diagnostics=diagnostics,
                                                                                      source=text)
    # the editor's outline of what does parse (lsp/document.py): positions are the file's own
    out.recovered_text = recovered  # type: ignore[attr-defined]
    return out


def _is_whole_line(line: str) -> bool:
    """The line (strings and comments left out) opens and closes no bracket and holds no quote
    left open: blanking it leaves the rest of its item well formed."""
    bare = re.sub(r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|#.*', "", line)
    return bare.strip() != "" and not any(c in bare for c in '{}[]()"')


MAX_NESTING = 32  # nested list[...] / {record} types; deeper is surely a mistake (and would exhaust the stack)
_NESTING_RULES = {"list_type", "record_type"}


def _check_nesting(tree, text: str, path: str) -> None:
    """A located error for types nested deeper than :data:`MAX_NESTING` (no recursion here:
    the tree may be thousands deep; everything after this point may recurse safely)."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if not hasattr(node, "children"):
            continue
        depth += node.data in _NESTING_RULES
        if depth > MAX_NESTING:
            meta = node.meta
            span = Span(path=path, line=meta.line, col=meta.column, end_line=meta.line, end_col=meta.column + 1)
            raise WorkflowSyntaxError(diagnostics=[Diagnostic(
                f"types nested deeper than {MAX_NESTING} levels", span,
                "flatten the type: a record of records, at most a few levels deep", code="too-deep")], source=text)
        stack.extend((c, depth) for c in node.children)


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
        raise WorkflowSyntaxError.at(str(p), f"cannot read the file: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        start = data.rfind(b"\n", 0, exc.start) + 1
        col = len(data[start:exc.start].decode("utf-8", errors="replace")) + 1  # characters, as elsewhere
        span = Span(path=str(p), line=line, col=col, end_line=line, end_col=col + 1)
        diag = Diagnostic(
            f"the file is not UTF-8: byte 0x{data[exc.start]:02x} cannot be decoded",
            span,
            "save the file as UTF-8",
            code="not-utf8",
        )
        # the source line is shown, decoded with U+FFFD for the bytes that are not UTF-8
        raise WorkflowSyntaxError(diagnostics=[diag], source=data.decode("utf-8", errors="replace")) from None


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


# Note [Strings without backtracking]
# Every pattern of a string literal (the grammar's STRING and LONG_STRING terminals, and the scans of
# this module and of lsp/completion.py) is written ``"a*(?:b a*)*"`` -- the loop unrolled -- never
# ``"(?:a|b)*"``: Python's regex engine keeps a backtracking frame per repetition of a group, so the
# alternation cost ~120 bytes per character of a string (a 1 MB prompt: 190 MB while lexing, a 5 MB
# one past 2 GB in the editor), while ``a*`` over a character class repeats without frames; the
# unrolled form keeps one frame per escape. Both forms match the same strings (the alternatives
# start with different characters, so there is one way to match). benchmarks/bench_lsp_hostile.py.
_SKIP_OR_NUMBER = re.compile(r'"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""|"[^"\\\n]*(?:\\.[^"\\\n]*)*"|#[^\n]*'
                             r'|(?<![A-Za-z0-9_.])[+-]?\.?[0-9][A-Za-z0-9_.]*(?:(?<=[eE])[+-][A-Za-z0-9_.]*)?', re.S)
_NUMBER = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def _malformed_number(text: str, path: str, before: int) -> WorkflowSyntaxError | None:
    """The first word that starts like a number but is none (``1e``, ``0x40``, ``0.7.1``, ``3px``)
    before offset ``before``: the lexer splits such a word into a number and a name, and the
    parser then fails somewhere after it, naming the wrong thing."""
    for m in _SKIP_OR_NUMBER.finditer(text, 0, min(len(text), before + 1)):
        word = m.group()
        if word[0] in '"#' or _NUMBER.fullmatch(word):
            continue
        line = text.count("\n", 0, m.start()) + 1
        col = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
        span = Span(path=path, line=line, col=col, end_line=line, end_col=col + len(word))
        why = ("hexadecimal is not supported" if re.match(r"[+-]?0[xXoObB]", word) else
               "more than one decimal point" if word.count(".") > 1 else
               "an exponent needs digits" if re.search(r"[eE][+-]?$", word) else "letters after the digits")
        return WorkflowSyntaxError(diagnostics=[Diagnostic(
            f"malformed number '{word}' ({why})", span,
            "numbers are written like 3, -2, 0.7, 1e-3 or 2.5E+4", code="bad-number")], source=text)
    return None


def _last_word_before(text: str, pos: int) -> tuple[str, int]:
    """The word (name) ending right before ``pos`` (whitespace skipped) and its start offset."""
    end = pos
    while end > 0 and text[end - 1] in " \t\f\r\n":
        end -= 1
    start = end
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return text[start:end], start


_NO_EXPECTATION = "compare this line with the syntax in docs/language.md"


def _syntax_error(exc: UnexpectedInput, text: str, path: str) -> WorkflowSyntaxError:
    line, col = max(exc.line, 1), max(exc.column, 1)
    hint = None
    stop: int  # where the text stops making sense: the lexer's offset, or the end of the bad token
    if isinstance(exc, UnexpectedCharacters):
        stop = cast(int, exc.pos_in_stream)  # lark types it None (its class default); the lexer sets an int
    else:
        assert isinstance(exc, UnexpectedToken)  # the LALR parser raises only these two
        stop = len(text) if exc.token.type == "$END" else exc.token.end_pos or len(text)
    bad_number = _malformed_number(text, path, stop)
    if bad_number is not None:  # the root cause: what follows only repeats it
        return bad_number
    if isinstance(exc, UnexpectedCharacters):
        char = text[stop] if stop < len(text) else ""
        if char == '"' and text[max(0, stop - 2):stop + 1] == '"""':
            # the lexer took `""` as an empty string before this quote: the string starts 2 back
            span = Span(path=path, line=line, col=col - 2, end_line=line, end_col=col + 1)
            return WorkflowSyntaxError(diagnostics=[Diagnostic(
                'unclosed """ string', span,
                'close it with """ (it may span lines; write \\" for a quote inside)', code="bad-string")],
                source=text)
        if char == '"':
            end = text.find("\n", stop)
            end = len(text) if end < 0 else end
            message = "unterminated string"
            hint = 'close the string with `"` on the same line, or use """triple quotes""" for several lines'
            span = Span(path=path, line=line, col=col, end_line=line, end_col=col + max(1, end - stop))
            return WorkflowSyntaxError(diagnostics=[Diagnostic(message, span, hint, code="bad-string")], source=text)
        message = f"unexpected character {char!r}"
        span = Span(path=path, line=line, col=col, end_line=line, end_col=col + 1)
        expected = sorted({_describe(t) for t in exc.allowed or ()})
        hint = "expected " + ", ".join(expected) if expected else _NO_EXPECTATION
        return WorkflowSyntaxError(diagnostics=[Diagnostic(message, span, hint, code="syntax")], source=text)

    assert isinstance(exc, UnexpectedToken)
    tok = exc.token
    special = _named_mistake(tok, text, path)
    if special is not None:
        return special
    label = None
    try:
        label = exc.match_examples(_lark().parse, _compiled_examples(), use_accepts=True)
    except UnexpectedInput:  # match_examples re-parses the examples; never let it hide the real error
        label = None
    opened = _unclosed_brace(text[: tok.start_pos] if tok.type != "$END" else text)
    # a top-level item inside a block: its keyword (lexed as a keyword, or as a name where a name
    # may stand) at the start of a line
    item_keyword = tok.type == "NAME" and tok.column == 1 and _ITEM_START.match(str(tok.value)) is not None
    if opened is not None and (tok.type in _TOP_KEYWORDS or item_keyword):
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
        hint = "expected " + ", ".join(expected) if expected else _NO_EXPECTATION
    code = "unclosed-block" if label is _EXAMPLES_KEYS[1] else "syntax"
    return WorkflowSyntaxError(diagnostics=[Diagnostic(message, span, hint, code=code)], source=text)


def _named_mistake(tok: Token, text: str, path: str) -> WorkflowSyntaxError | None:
    """Mistakes whose parser error would name a later token: a trailing comma in a list of
    names (the next item's keyword is read as one more name, then its ':' fails), and a
    `route` without the output it routes on."""
    pos = tok.start_pos or 0  # always set on the lexer's tokens
    if tok.type == "COLON":
        word, start = _last_word_before(text, pos)
        comma = start
        while comma > 0 and text[comma - 1] in " \t\f\r\n":
            comma -= 1
        if word and comma > 0 and text[comma - 1] == ",":
            at = comma - 1
            line = text.count("\n", 0, at) + 1
            col = at - (text.rfind("\n", 0, at) + 1) + 1
            span = Span(path=path, line=line, col=col, end_line=line, end_col=col + 1)
            return WorkflowSyntaxError(diagnostics=[Diagnostic(
                f"trailing ',' at the end of a list of names (so `{word}:` was read as one more name)", span,
                "remove the ',' after the last name", code="syntax")], source=text)
    word, start = _last_word_before(text, pos)
    if word == "route" and tok.type != "NAME":  # `route` not followed by the output it routes on
        if tok.type == "LBRACE":
            return WorkflowSyntaxError(diagnostics=[Diagnostic(
                "`route` needs the output it routes on", tok_span(tok, path),
                "write `activate: route AGENT { label -> AGENT, ... }` (AGENT's output is a choice[...])",
                code="syntax")], source=text)
        line = text.count("\n", 0, start) + 1
        col = start - (text.rfind("\n", 0, start) + 1) + 1
        span = Span(path=path, line=line, col=col, end_line=line, end_col=col + len(word))
        if tok.type == "COMMA":  # `activate: route, a`: `route` used as an agent name
            return WorkflowSyntaxError(diagnostics=[Diagnostic(
                "`route` is a keyword of `activate:`, not an agent", span,
                "to activate agents list them (`activate: a, b`); to route on a choice write "
                "`activate: route AGENT { label -> AGENT, ... }` on its own", code="bad-route")], source=text)
        return WorkflowSyntaxError(diagnostics=[Diagnostic(
            "`route` needs the output it routes on and its cases", span,
            "write `activate: route AGENT { label -> AGENT, ... }` (AGENT's output is a choice[...])",
            code="bad-route")], source=text)
    return None


_EXAMPLES_KEYS = list(_EXAMPLES)
_TOP_KEYWORDS = {"$END", "AGENT", "TRANSITION", "TASK", "IMPORT", "START", "MAX_STEPS", "WORKFLOW"}

_SCAN = re.compile(r'"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""|"[^"\\\n]*(?:\\.[^"\\\n]*)*"|#[^\n]*|[{}]|\n', re.S)


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
