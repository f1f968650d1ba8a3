"""Positions: the checker's spans (1-based lines, columns in characters) <-> LSP positions.

Stage: lsp. LSP counts lines from 0 and columns in the client's code units (UTF-16 unless the
client negotiated UTF-8 or UTF-32), so a prompt with ``é`` or an emoji shifts every column after
it. Lines end at ``\\n``, ``\\r\\n`` or ``\\r`` only, as for the parser and as LSP says
(:func:`srpo_graph.errors.source_lines`); never ``str.splitlines``, which also splits at U+2028
and form feeds. Knows nothing of the language.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lsprotocol import types as lsp

from srpo_graph.errors import Span, source_lines


def utf16_units(text: str) -> int:
    """UTF-16 code units of ``text`` (LSP's default column unit).

    >>> utf16_units("a"), utf16_units("é"), utf16_units("😀")
    (1, 1, 2)
    """
    return len(text.encode("utf-16-le")) // 2


@dataclass
class Lines:
    """A document's lines and the client's column unit.

    >>> ln = Lines("say 😀 {x}\\nb")
    >>> p = ln.to_lsp(1, 8); (p.line, p.character), ln.from_lsp(lsp.Position(line=0, character=7))
    ((0, 8), (0, 6))
    """

    text: str
    units: Callable[[str], int] = utf16_units

    def __post_init__(self) -> None:
        self.lines = source_lines(self.text)
        starts, at = [], 0
        for line, m in zip(self.lines, _breaks(self.text)):
            starts.append(at)
            at += len(line) + m
        self.starts = starts  # offset of each line's first character

    def to_lsp(self, line: int, col: int) -> lsp.Position:
        """The LSP position of a 1-based (line, character column)."""
        if line < 1:
            return lsp.Position(line=0, character=0)
        if line > len(self.lines):
            last = len(self.lines) - 1
            return lsp.Position(line=last, character=self.units(self.lines[last]))
        text = self.lines[line - 1]
        return lsp.Position(line=line - 1, character=self.units(text[: max(0, col - 1)]))

    def span_range(self, span: Span | None) -> lsp.Range:
        """The LSP range of a span (no span: the first character of the file)."""
        if span is None:
            return lsp.Range(start=lsp.Position(line=0, character=0), end=lsp.Position(line=0, character=0))
        return lsp.Range(start=self.to_lsp(span.line, span.col), end=self.to_lsp(span.end_line, span.end_col))

    def from_lsp(self, pos: lsp.Position) -> tuple[int, int]:
        """(0-based line, 0-based character index) of an LSP position (clamped to the text)."""
        if not self.lines:
            return 0, 0
        line = min(max(pos.line, 0), len(self.lines) - 1)
        text, units, i = self.lines[line], 0, 0
        while i < len(text) and units < pos.character:
            units += self.units(text[i])
            i += 1
        return line, i

    def offset(self, line0: int, char0: int) -> int:
        """The offset in the text of a 0-based line and character index."""
        return self.starts[line0] + char0 if line0 < len(self.starts) else len(self.text)

    def offset_of(self, line: int, col: int) -> int:
        """The offset of a 1-based (line, column), as in a :class:`Span`."""
        return self.offset(line - 1, col - 1)

    def line_col(self, offset: int) -> tuple[int, int]:
        """The 1-based (line, column) of an offset."""
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - self.starts[lo] + 1

    def end(self) -> lsp.Position:
        """The position after the last character."""
        return self.to_lsp(len(self.lines), len(self.lines[-1]) + 1)


def _breaks(text: str):
    """The length of each line's line break (0 for the last line)."""
    import re

    for m in re.finditer(r"\r\n|\r|\n", text):
        yield len(m.group())
    yield 0


def contains(span: Span, line: int, col: int) -> bool:
    """Whether the 1-based (line, column) is inside ``span`` (its end included: a cursor right
    after a name still points at it)."""
    return (span.line, span.col) <= (line, col) <= (span.end_line, span.end_col)
