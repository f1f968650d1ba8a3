"""Completion of a chat agent's items (issue 21): `system:`, `memory:` and `think:` are offered
inside an agent, and the values of `memory` and `think` after their colon."""

from __future__ import annotations

from srpo_graph.lsp.completion import complete

HEAD = 'workflow w\nimport std\npolicy p = "qwen3-test"\nagent a {\n  policy: p\n  '


def _labels(text: str) -> set[str]:
    return {i.label for i in complete(text, len(text), None, None)}


def test_chat_items_and_their_values_are_completed():
    assert {"system:", "memory:", "think:"} <= _labels(HEAD)
    assert _labels(HEAD + "memory: ") == {"chat", "none"}
    assert _labels(HEAD + "think: ") == {"keep", "strip"}
