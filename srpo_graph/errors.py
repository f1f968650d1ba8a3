"""Errors and source spans shared by every stage.

One root, :class:`SrpoGraphError`, and one subclass per stage. An error that can
point into a ``.wf`` file carries :class:`Diagnostic` items with a :class:`Span`;
:func:`render` prints them compiler-style::

    workflows/bad.wf:3:9: error: unknown policy 'tiniest'
      3 |   policy: tiniest
        |           ^~~~~~~
      hint: declared policies are: tiny

The CLI prints ``str(error)`` (never a traceback) and exits with ``error.exit_code``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

from pydantic import BaseModel, ConfigDict

MAX_REPORTED = 20
MAX_SHOWN_LINE = 120  # characters of a source line shown under an error (longer ones: a window)


class Span(BaseModel):
    """A region of a source file, 1-based lines and columns, end exclusive.

    >>> Span(path="a.wf", line=2, col=5, end_line=2, end_col=9).where()
    'a.wf:2:5'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    line: int
    col: int
    end_line: int
    end_col: int

    def where(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Diagnostic:
    """One problem found in a source: what, where, and how to fix it."""

    message: str
    span: Span | None = None
    hint: str | None = None
    severity: Literal["error", "warning"] = "error"
    code: str = "E"  # a short stable code tests can assert on, e.g. "unknown-name"


_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# characters shown as a visible stand-in (one character each, so the caret stays aligned):
# line-breaking for str.splitlines or a terminal, but not for the .wf lexer
_VISIBLE = str.maketrans({"\r": "␍", "\v": "␋", "\f": "␌", "\x1c": "␜", "\x1d": "␝", "\x1e": "␞",
                          "\x85": "␤", "\u2028": "␤", "\u2029": "¶", "\x00": "␀", "\x1b": "␛",
                          "\ufeff": "◌", "\u200b": "◌"})


def source_lines(text: str) -> list[str]:
    """The lines of a source as the parser counts them: a line ends at ``\\n``, ``\\r\\n`` or ``\\r``
    only (not at U+2028, a form feed or ``\\v``, which ``str.splitlines`` also splits at).

    >>> [len(line) for line in source_lines("a\\r\\nb\\rc\\u2028d\\fe")]  # c, U+2028, d, form feed, e
    [1, 1, 5]
    """
    return _LINE_BREAK.split(text)


def _source_line(span: Span, source: str | None) -> str | None:
    if source is None:
        try:
            source = Path(span.path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
    lines = source_lines(source)
    if 1 <= span.line <= len(lines):
        return lines[span.line - 1]
    return None


def render_diagnostic(diag: Diagnostic, source: str | None = None) -> str:
    """Render one diagnostic as ``path:line:col: error: msg``, the line and a ``^~~`` underline.

    >>> d = Diagnostic("unknown policy 'x'", Span(path="w.wf", line=1, col=9, end_line=1, end_col=10))
    >>> print(render_diagnostic(d, source="policy: x"))
    w.wf:1:9: error: unknown policy 'x'
      1 | policy: x
        |         ^
    """
    head = f"{diag.severity}: {diag.message}"
    if diag.span is None:
        out = [head]
    else:
        out = [f"{diag.span.where()}: {head}"]
        text = _source_line(diag.span, source)
        if text is not None:
            gutter = str(diag.span.line)
            pad = " " * len(gutter)
            width = (
                diag.span.end_col - diag.span.col
                if diag.span.end_line == diag.span.line
                else len(text) - diag.span.col + 1
            )
            width = max(1, width)
            col = diag.span.col
            if len(text) > MAX_SHOWN_LINE:  # a window around the column, so the caret stays on screen
                start = max(0, min(col - 1 - MAX_SHOWN_LINE // 3, len(text) - MAX_SHOWN_LINE))
                text = ("…" if start else "") + text[start:start + MAX_SHOWN_LINE] + (
                    "…" if start + MAX_SHOWN_LINE < len(text) else "")
                col = col - start + (1 if start else 0)
                width = min(width, MAX_SHOWN_LINE - col + 2)
            out.append(f"  {gutter} | {text.replace(chr(9), ' ').translate(_VISIBLE)}")
            out.append(f"  {pad} | {' ' * (col - 1)}^{'~' * (max(1, width) - 1)}")
    if diag.hint:
        out.append(f"  hint: {diag.hint}")
    return "\n".join(out)


def render(diags: Sequence[Diagnostic], source: str | None = None, limit: int = MAX_REPORTED) -> str:
    """Render several diagnostics, capped at ``limit`` ("... and N more")."""
    shown = [render_diagnostic(d, source) for d in diags[:limit]]
    if len(diags) > limit:
        shown.append(f"... and {len(diags) - limit} more")
    return "\n".join(shown)


class SrpoGraphError(Exception):
    """Root of every error srpo-graph raises on purpose."""

    exit_code = 1

    def __init__(self, message: str = "", diagnostics: Sequence[Diagnostic] = (), source: str | None = None):
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        self.source = source
        if not message and self.diagnostics:
            message = render(self.diagnostics, source)
        super().__init__(message)


class WorkflowSyntaxError(SrpoGraphError):
    """A ``.wf`` file does not parse (or is not UTF-8)."""

    exit_code = 2


class WorkflowCheckError(SrpoGraphError):
    """A ``.wf`` file parses but breaks a name, type or graph rule."""

    exit_code = 2


class BackendError(SrpoGraphError):
    """An inference backend failed, stopped answering or answered malformed data."""

    exit_code = 3


class TraceError(SrpoGraphError):
    """A trace file or line does not match the trace schema."""

    exit_code = 4


class RuntimeFailure(SrpoGraphError):
    """The executor could not run a workflow (not a per-episode tool failure)."""

    exit_code = 5


class CompileError(SrpoGraphError):
    """Traces cannot be compiled into a SetBatch."""

    exit_code = 6


class ConfigError(SrpoGraphError):
    """A training or run configuration is invalid."""

    exit_code = 7


@dataclass
class DiagnosticSink:
    """Collects diagnostics so a stage can report every problem at once."""

    items: list[Diagnostic] = field(default_factory=list)

    def error(self, message: str, span: Span | None = None, hint: str | None = None, code: str = "E") -> None:
        self.items.append(Diagnostic(message, span, hint, "error", code))

    def warning(self, message: str, span: Span | None = None, hint: str | None = None, code: str = "W") -> None:
        self.items.append(Diagnostic(message, span, hint, "warning", code))

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.items if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.items if d.severity == "warning"]
