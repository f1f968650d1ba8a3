"""String literals and prompt templates of ``.wf`` source: escapes and ``{reference}`` holes.

Stage: lang (parse). Used by the parser while it builds nodes; turns the raw text between the
quotes into decoded text, and a prompt into :class:`~srpo_graph.lang.ast.TextPiece` and
:class:`~srpo_graph.lang.ast.Ref` parts, each hole with its own exact span. Also the inverse
(:func:`encode_string`, :func:`encode_template`) for the formatter. Knows nothing of names.
"""

from __future__ import annotations

import re

from srpo_graph.errors import Diagnostic, Span, WorkflowSyntaxError
from srpo_graph.lang import ast

_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "{": "{", "}": "}"}
# ordinary characters (taken as one slice each run: no string per character)
_PLAIN = re.compile(r"[^\\]*")
_PLAIN_HOLES = re.compile(r"[^\\{}]*")
_HOLE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(\?)?\s*")


def _at(span: Span, raw: str, i: int, triple: bool) -> tuple[int, int]:
    """Line and column of ``raw[i]`` given the string token's span."""
    before = raw[:i]
    nl = before.count("\n")
    opening = 3 if triple else 1
    if nl == 0:
        return span.line, span.col + opening + i
    return span.line + nl, i - before.rfind("\n")


def _error(message: str, span: Span, raw: str, i: int, j: int, triple: bool, hint: str, code: str):
    line, col = _at(span, raw, i, triple)
    end_line, end_col = _at(span, raw, j, triple)
    if end_line != line:
        end_line, end_col = line, col + 1
    where = Span(path=span.path, line=line, col=col, end_line=end_line, end_col=max(end_col, col + 1))
    return WorkflowSyntaxError(diagnostics=[Diagnostic(message, where, hint, code=code)])


def _scan(raw: str, span: Span, triple: bool, holes: bool) -> tuple:
    parts: list = []
    buf: list[str] = []
    i = 0
    plain = _PLAIN_HOLES if holes else _PLAIN
    while i < len(raw):
        run = plain.match(raw, i)
        if run is not None and run.end() > i:
            run_end = run.end()
            buf.append(raw[i:run_end])
            i = run_end
            continue
        c = raw[i]
        if c == "\\":
            nxt = raw[i + 1] if i + 1 < len(raw) else ""
            if nxt not in _ESCAPES:
                raise _error(
                    f"unknown escape '\\{nxt}' in a string", span, raw, i, i + 2, triple,
                    "the escapes are \\n \\t \\\" \\\\ \\{ \\}", "bad-string",
                )
            buf.append(_ESCAPES[nxt])
            i += 2
        elif holes and c == "{":
            close = raw.find("}", i)
            m = _HOLE.fullmatch(raw, i + 1, close) if close >= 0 else None
            if m is None:
                end = close + 1 if close >= 0 else i + 1
                raise _error(
                    "bad template reference" if close >= 0 else "unclosed '{' in a prompt",
                    span, raw, i, end, triple,
                    "a hole is {task.FIELD}, {AGENT}, {AGENT.FIELD} or {TOOL}, '?' marks it optional;"
                    " write \\{ for a literal brace", "bad-template",
                )
            if buf:
                parts.append(ast.TextPiece("".join(buf)))
                buf = []
            line, col = _at(span, raw, i, triple)
            end_line, end_col = _at(span, raw, close + 1, triple)
            parts.append(
                ast.Ref(
                    tuple(m.group(1).split(".")), m.group(2) is not None,
                    Span(path=span.path, line=line, col=col, end_line=end_line, end_col=end_col),
                )
            )
            i = close + 1
        elif holes and c == "}":
            raise _error("unmatched '}' in a prompt", span, raw, i, i + 1, triple,
                         "write \\} for a literal brace", "bad-template")
    if buf:
        parts.append(ast.TextPiece("".join(buf)))
    return tuple(parts)


def decode_string(raw: str, span: Span, triple: bool = False) -> str:
    r"""Decode the escapes of a string literal (the text between its quotes).

    >>> s = Span(path="x", line=1, col=1, end_line=1, end_col=9)
    >>> decode_string(r"a\n\{b", s)
    'a\n{b'
    """
    parts = _scan(raw, span, triple, holes=False)
    return parts[0].text if parts else ""


def split_template(raw: str, span: Span, triple: bool = False) -> tuple:
    """Split a prompt (the text between its quotes) into text pieces and reference holes.

    >>> s = Span(path="x", line=1, col=1, end_line=1, end_col=20)
    >>> [type(p).__name__ for p in split_template("<a>{task.target}{b?}", s)]
    ['TextPiece', 'Ref', 'Ref']
    """
    return _scan(raw, span, triple, holes=True)


def encode_string(value: str, triple: bool = False, braces: bool = False) -> str:
    r"""The canonical source form of a string value (with quotes).

    >>> encode_string('say "hi"\n')
    '"say \\"hi\\"\\n"'
    """
    out = value.replace("\\", "\\\\")
    if braces:
        out = out.replace("{", "\\{").replace("}", "\\}")
    if triple:
        out = out.replace('"', '\\"').replace("\t", "\\t")
        return f'"""{out}"""'
    out = out.replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{out}"'


def encode_template(template: ast.Template) -> str:
    """The canonical source form of a prompt template."""
    inner = []
    for part in template.parts:
        if isinstance(part, ast.Ref):
            inner.append("{" + ".".join(part.path) + ("?" if part.optional else "") + "}")
        else:
            enc = encode_string(part.text, template.triple_quoted, braces=True)
            inner.append(enc[3:-3] if template.triple_quoted else enc[1:-1])
    q = '"""' if template.triple_quoted else '"'
    return q + "".join(inner) + q
