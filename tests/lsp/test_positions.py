"""Spans <-> LSP positions in every column unit LSP defines (UTF-16, UTF-8, UTF-32), checked
against an independent count (``str.encode``) at every character of a text with accents,
astral characters, tabs, and all three line endings."""

from __future__ import annotations

import pytest
from lsprotocol import types as lsp

from srpo_graph.errors import Span
from srpo_graph.lsp.positions import Lines

TEXT = 'workflow w\r\nagent a { prompt: "𝔖 café 😀\t{task.q}" }\rstart: a\n# ✓ done'
UNITS = {
    "utf-16": lambda s: len(s.encode("utf-16-le")) // 2,
    "utf-8": lambda s: len(s.encode("utf-8")),
    "utf-32": len,
}


@pytest.mark.parametrize("unit", UNITS)
def test_every_character_round_trips(unit):
    count = UNITS[unit]
    lines = Lines(TEXT, count)
    physical = TEXT.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    assert lines.lines == physical
    for i, line in enumerate(physical):
        for c in range(len(line) + 1):
            pos = lines.to_lsp(i + 1, c + 1)
            assert (pos.line, pos.character) == (i, count(line[:c]))
            assert lines.from_lsp(pos) == (i, c)
            offset = lines.offset(i, c)
            assert lines.line_col(offset) == (i + 1, c + 1)
            assert TEXT[offset:offset + 1] == (line[c:c + 1] or TEXT[offset:offset + 1])


def test_a_span_becomes_a_range_and_no_span_the_file_start():
    lines = Lines(TEXT)
    line = TEXT.split("\r\n")[1].split("\r")[0]
    col = line.index("{task.q}") + 1
    rng = lines.span_range(Span(path="x", line=2, col=col, end_line=2, end_col=col + len("{task.q}")))
    assert rng.start == lsp.Position(line=1, character=col - 1 + 2)  # 𝔖 and 😀 take two UTF-16 units, é one
    assert rng.end.character - rng.start.character == len("{task.q}")
    assert lines.span_range(None) == lsp.Range(start=lsp.Position(line=0, character=0),
                                               end=lsp.Position(line=0, character=0))


def test_positions_past_the_end_are_clamped():
    lines = Lines("ab\ncd")
    assert lines.from_lsp(lsp.Position(line=9, character=9)) == (1, 2)
    assert lines.to_lsp(9, 1) == lines.end() == lsp.Position(line=1, character=2)
