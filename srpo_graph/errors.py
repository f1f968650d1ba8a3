"""Errors and source spans shared by every stage.

One root, :class:`SrpoGraphError`, and one subclass per stage; every error a user sees is made of
:class:`Diagnostic` items (what, where, why, fix) and printed by one renderer, :func:`render`.
Where is a :class:`Span` when the problem is in a ``.wf`` file (the line is shown, underlined),
else a location string (``traces.jsonl:12``, ``field `optim.lr```, ``override 'x=1'``)::

    workflows/bad.wf:3:9: error: unknown policy 'tiniest'
      3 |   policy: tiniest
        |           ^~~~~~~
      fix: declared policies are: tiny

    runs/x/config.toml: error: field `optim.eps`: 1e-46 is below the smallest normal float32 number
      why: Adam divides by sqrt(v) + eps; an eps that rounds to 0 gives inf/NaN weights
      fix: use optim.eps >= 1.18e-38

Build one with ``ConfigError.at(where, message, why=..., fix=...)`` (or ``span=``). The CLI prints
``str(error)`` (never a traceback) and exits with ``error.exit_code``: :data:`EXIT_CODES`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Sequence

from pydantic import BaseModel, ConfigDict

from srpo_graph.supervisor import USER_EXIT

if TYPE_CHECKING:
    from typing_extensions import Self

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
    """One problem: what (``message``), where (a ``.wf`` ``span``, or a ``where`` string for
    other inputs), why (optional) and how to fix it (``hint``, rendered ``fix: ...``)."""

    message: str
    span: Span | None = None
    hint: str | None = None  # the fix
    severity: Literal["error", "warning"] = "error"
    code: str = "E"  # a short stable code tests can assert on, e.g. "unknown-name"
    where: str | None = None  # the location when there is no span: a file, file:line, a config field
    why: str | None = None
    # other places the problem involves, as (span, what it is), e.g. the first declaration of a
    # duplicate name: an editor shows them as related locations (srpo_graph/lsp)
    related: tuple[tuple[Span, str], ...] = ()

    def headline(self) -> str:
        """The first line of the rendering: ``path:line:col: error: message`` (or without a place).

        >>> where = Span(path="s.wf", line=41, col=3, end_line=41, end_col=9)
        >>> Diagnostic("tool 'docs' raised KeyError('q')", where).headline()
        "s.wf:41:3: error: tool 'docs' raised KeyError('q')"
        """
        place = self.span.where() if self.span is not None else self.where
        return f"{place}: {self.severity}: {self.message}" if place else f"{self.severity}: {self.message}"


_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# characters shown as a visible stand-in (one character each, so the caret stays aligned):
# line-breaking for str.splitlines or a terminal, but not for the .wf lexer
_VISIBLE = str.maketrans(
    {
        "\r": "␍",
        "\v": "␋",
        "\f": "␌",
        "\x1c": "␜",
        "\x1d": "␝",
        "\x1e": "␞",
        "\x85": "␤",
        "\u2028": "␤",
        "\u2029": "¶",
        "\x00": "␀",
        "\x1b": "␛",
        "\ufeff": "◌",
        "\u200b": "◌",
    }
)


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
    out = [diag.headline()]
    if diag.span is not None:
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
                text = (
                    ("…" if start else "")
                    + text[start : start + MAX_SHOWN_LINE]
                    + ("…" if start + MAX_SHOWN_LINE < len(text) else "")
                )
                col = col - start + (1 if start else 0)
                width = min(width, MAX_SHOWN_LINE - col + 2)
            out.append(f"  {gutter} | {text.replace(chr(9), ' ').translate(_VISIBLE)}")
            out.append(f"  {pad} | {' ' * (col - 1)}^{'~' * (max(1, width) - 1)}")
    for label, text in (("why", diag.why), ("fix", diag.hint)):
        if text:
            out.append(f"  {label}: " + text.replace("\n", "\n  " + " " * len(label) + "  "))
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

    @classmethod
    def at(
        cls,
        where: str | None,
        message: str,
        *,
        why: str | None = None,
        fix: str | None = None,
        span: Span | None = None,
        code: str = "E",
        source: str | None = None,
    ) -> Self:
        """One error with one :class:`Diagnostic`, rendered like every other.

        >>> print(ConfigError.at("field `optim.lr`", "must be > 0 (got -1)", fix="use e.g. optim.lr=1e-3"))
        field `optim.lr`: error: must be > 0 (got -1)
          fix: use e.g. optim.lr=1e-3
        """
        return cls(diagnostics=[Diagnostic(message, span, fix, code=code, where=where, why=why)], source=source)


class WorkflowSyntaxError(SrpoGraphError):
    """A ``.wf`` file does not parse (or is not UTF-8)."""

    exit_code = 2


class WorkflowCheckError(SrpoGraphError):
    """A ``.wf`` file parses but breaks a name, type or graph rule."""

    exit_code = 2


class BackendError(SrpoGraphError):
    """An inference backend failed, stopped answering or answered malformed data.

    Attributes:
        remedy: what to do before resuming when this error stops a training run (None: check the
            server; a subclass whose failure has no server says what instead).
    """

    exit_code = 3
    remedy: str | None = None


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


EXIT_CODES: dict[int, str] = {  # the process exit status of `srpo-graph` (docs/architecture.md, generated)
    0: "success",
    SrpoGraphError.exit_code: "another srpo-graph error (e.g. a run stopped because the disk is full; checkpoints "
    "intact)",
    WorkflowSyntaxError.exit_code: "a `.wf` file does not parse or check (also: a command-line usage error, click's 2)",
    BackendError.exit_code: "an inference backend failed, stopped answering or could not start",
    TraceError.exit_code: "a trace file or line does not match the trace schema",
    RuntimeFailure.exit_code: "the executor could not run the workflow",
    CompileError.exit_code: "traces cannot be compiled into a SetBatch",
    ConfigError.exit_code: "a configuration, override, task file or run folder is invalid",
    USER_EXIT: "the process ended outside srpo-graph: user code (a reward, tool, extractor, a module's import) "
    "called `os._exit` (with any status, 0 too); one line names the call that was running (`train`: and the "
    "resume command)",
    130: "interrupted (Ctrl-C); a training run prints the `--resume` command that continues it",
    137: "killed (SIGKILL) while the command ran; like any 128 + N (signal N) it comes with one line naming the "
    "user call that was running (`train`: and the resume command)",
    139: "a crash in native code (SIGSEGV, e.g. in a C extension of user code); one line names the user call that "
    "was running (`train`: and the resume command)",
    143: "terminated (SIGTERM); a training run stops like Ctrl-C and resumes the same way",
}


def exit_codes_table() -> str:
    """The markdown table of :data:`EXIT_CODES` (docs/architecture.md's generated block).

    >>> exit_codes_table().splitlines()[2]
    '| 0 | success |'
    """
    classes = {
        c.exit_code: c.__name__
        for c in (WorkflowSyntaxError, BackendError, TraceError, RuntimeFailure, CompileError, ConfigError)
    }
    rows = ["| exit | meaning |", "|---|---|"]
    for code, meaning in sorted(EXIT_CODES.items()):
        rows.append(f"| {code} | {meaning}" + (f" (`{classes[code]}`)" if code in classes else "") + " |")
    return "\n".join(rows)


@dataclass
class DiagnosticSink:
    """Collects diagnostics so a stage can report every problem at once."""

    items: list[Diagnostic] = field(default_factory=list)

    def error(
        self,
        message: str,
        span: Span | None = None,
        hint: str | None = None,
        code: str = "E",
        related: tuple[tuple[Span, str], ...] = (),
    ) -> None:
        self.items.append(Diagnostic(message, span, hint, "error", code, related=related))

    def warning(self, message: str, span: Span | None = None, hint: str | None = None, code: str = "W") -> None:
        self.items.append(Diagnostic(message, span, hint, "warning", code))

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.items if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.items if d.severity == "warning"]
