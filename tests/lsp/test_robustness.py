"""Every feature of the server on broken text never raises: shipped examples mutated at random
(characters deleted, inserted, swapped; quotes, braces and non-ASCII among them), each feature
asked at random positions. In process, the same functions the server calls (the server's own
tests, over stdio, type a file character by character)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lsprotocol import types as lsp

from srpo_graph.lsp import completion, features
from srpo_graph.lsp.document import analyze
from srpo_graph.lsp.positions import Lines

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "workflows").rglob("*.wf"))
TEXTS = [p.read_text(encoding="utf-8") for p in EXAMPLES]
CHARS = st.sampled_from(list('{}[]()"\\:,.?#=-> \n\r\tabz_019é😀𝔖') + ['"""', "->", "task.", "std.", "end"])


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["insert", "delete", "swap"]))
        if kind == "insert":
            text = text[:at] + draw(CHARS) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 12)):]
        elif at + 1 < len(text):
            text = text[:at] + text[at + 1] + text[at] + text[at + 2:]
    return text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated(), picks=st.lists(st.floats(0, 1), min_size=3, max_size=3), name=st.sampled_from(["x", "q1", "2x"]))
def test_no_feature_raises_on_broken_text(text, picks, name):
    a = analyze(text, str(ROOT / "workflows" / "mutated.wf"))
    lines = Lines(text)
    for f in picks:
        line0 = int(f * (len(lines.lines) - 1))
        char0 = int(f * len(lines.lines[line0]))
        pos = lines.to_lsp(line0 + 1, char0 + 1)
        line, col = lines.from_lsp(pos)
        assert (line, col) == (line0, char0)
        features.hover(a, line + 1, col + 1, lines)
        features.definition(a, line + 1, col + 1, lines)
        features.references(a, line + 1, col + 1, lines, True)
        features.prepare_rename(a, line + 1, col + 1, lines)
        try:
            features.rename(a, line + 1, col + 1, name, lines)
        except features.RenameError:
            pass
        items = completion.complete(text, lines.offset(line, col), a.index, None)
        assert all(isinstance(i, lsp.CompletionItem) for i in items)
    features.document_symbols(a, lines)
    features.formatting(a, lines)
    assert not [d for d in a.diagnostics if d.code == "internal"], [d.message for d in a.diagnostics]  # no checker bug
