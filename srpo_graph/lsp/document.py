"""One open ``.wf`` document, analyzed: parsed, checked, indexed.

Stage: lsp. Consumes the text of a document; produces an :class:`Analysis`: the diagnostics
exactly as ``srpo-graph check`` finds them (the same :func:`~srpo_graph.lang.parser.parse` and
:func:`~srpo_graph.lang.checker.check_module`, under an :class:`ImportPolicy`), the parsed
module and its :class:`~srpo_graph.lsp.symbols.Index`, and the checked ``Workflow`` when the
file has no error. ``check``'s token rule (tokenizers of a later stage) is not run here.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from srpo_graph.errors import Diagnostic, Span, SrpoGraphError, WorkflowSyntaxError
from srpo_graph.lang import ast
from srpo_graph.lang.checker import CheckResult, ImportPolicy, check_module
from srpo_graph.lang.parser import parse
from srpo_graph.lsp.symbols import Index, build_index
from srpo_graph.workflow import Workflow

NO_IMPORT = ImportPolicy(no_import=True)


@dataclass
class Analysis:
    """What the server knows of one version of a document."""

    text: str
    path: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    module: ast.Module | None = None  # None: it does not parse
    index: Index | None = None
    result: CheckResult | None = None  # None: it does not check
    seconds: float = 0.0  # the time parse + check + index took
    # tool result types from the check with imports (lsp/imports.py), when it ran: name -> type
    tool_types: dict[str, str] = field(default_factory=dict)
    # after a syntax error: the index of the items that do parse (the outline keeps them), else None
    partial: Index | None = None
    too_large: bool = False  # over the live-analysis limits: not analyzed (one diagnostic says so)

    @property
    def workflow(self) -> Workflow | None:
        return self.result.workflow if self.result is not None else None


def analyze(text: str, path: str, imports: ImportPolicy = NO_IMPORT) -> Analysis:
    """Parse, check and index ``text`` (never raises: every problem becomes a diagnostic).

    Args:
        text: the document's text.
        path: its file path (spans and messages name it; imports are searched next to it).
        imports: which Python modules the check may import (default: none but ``std``).

    Returns:
        The :class:`Analysis`.

    >>> a = analyze('workflow w import std policy p = "tiny" agent a { policy: q prompt: "x" unconsumed: allow }'
    ...             ' start: a', "w.wf")
    >>> [(d.span.line, d.span.col, d.message) for d in a.diagnostics]
    [(1, 59, "unknown policy 'q'")]
    """
    t0 = time.perf_counter()
    out = Analysis(text=text, path=path)
    try:
        out.module = parse(text, path)
    except WorkflowSyntaxError as exc:
        out.diagnostics = list(exc.diagnostics)
        recovered = getattr(exc, "recovered_text", None)
        if recovered is not None:  # the broken items blanked (Note [Syntax error recovery])
            try:
                out.partial = build_index(parse(recovered, path))
            except Exception:  # noqa: BLE001 - no outline is better than a broken editor
                out.partial = None
    except Exception as exc:  # noqa: BLE001 - a parser bug must not take the editor down
        out.diagnostics = [_internal(exc, path)]
    if out.module is not None:
        out.index = build_index(out.module)
        base = Path(path).resolve().parent if not path.startswith("<") else None
        try:
            out.result = check_module(out.module, text, base_dir=base, imports=imports)
            out.diagnostics = list(out.result.warnings)
        except SrpoGraphError as exc:
            out.diagnostics = list(exc.diagnostics) or [Diagnostic(str(exc), None, code="check")]
        except Exception as exc:  # noqa: BLE001 - a checker bug: shown, not fatal
            out.diagnostics = [_internal(exc, path)]
    out.seconds = time.perf_counter() - t0
    return out


# Note [Bounded work per document]
# The server analyzes a document on every pause in typing, so the cost of one analysis must be
# bounded whatever the client sends: a document over any of the limits below is not parsed at all;
# it gets one diagnostic naming the measure, its value and the limit (``srpo-graph check`` still
# checks it). The limits are far above any real workflow (the largest shipped one is 3 KB, 100
# lines, 7 agents) and bound the worst analysis to seconds (1,000 agents: about 2 s on an idle
# 2-core machine; 1 MB of prompt: 0.4 s); the settings ``maxBytes``, ``maxLines`` and ``maxAgents``
# move them. Counting is one pass over the text, no parse. Memory stays a small multiple of the text
# too: the string terminals lex without backtracking (Note [Strings without backtracking]).
_AGENT_LINE = re.compile(r"^[ \t]*agent[ \t]", re.M)


@dataclass(frozen=True)
class Limits:
    """What the server analyzes live (Note [Bounded work per document])."""

    max_bytes: int = 1_000_000
    max_lines: int = 20_000
    max_agents: int = 1_000

    def exceeded(self, text: str) -> str | None:
        r"""Why ``text`` is over a limit (the measure, its value and the limit), or None.

        >>> Limits(max_agents=1).exceeded("agent a {}\nagent b {}")
        '2 agents (the limit is 1)'
        """
        size = len(text) if len(text) * 4 <= self.max_bytes else len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_bytes:
            return f"{size:,} bytes (the limit is {self.max_bytes:,})"
        lines = text.count("\n") + 1
        if lines > self.max_lines:
            return f"{lines:,} lines (the limit is {self.max_lines:,})"
        agents = sum(1 for _ in _AGENT_LINE.finditer(text))
        if agents > self.max_agents:
            return f"{agents:,} agents (the limit is {self.max_agents:,})"
        return None


def too_large(text: str, path: str, why: str) -> Analysis:
    """The analysis of a document over the limits: not parsed, one warning that says why."""
    message = f"the document is too large for live analysis: {why}"
    hint = "`srpo-graph check` checks it in full; the settings maxBytes, maxLines and maxAgents raise the limits"
    return Analysis(text=text, path=path, too_large=True, diagnostics=[Diagnostic(
        message, Span(path=path, line=1, col=1, end_line=1, end_col=1), hint, code="too-large", severity="warning")])


def _internal(exc: Exception, path: str) -> Diagnostic:
    return Diagnostic(f"internal error of srpo-graph while checking: {type(exc).__name__}: {exc}",
                      Span(path=path, line=1, col=1, end_line=1, end_col=1), "please report it", code="internal")
