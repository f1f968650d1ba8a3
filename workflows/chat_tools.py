"""Tools and the reward of workflows/chat_search_qwen3.wf (a chat agent that searches in turns)."""

from __future__ import annotations

from typing import Literal


def move(text: str) -> Literal["search", "answer"]:
    """``answer`` once the searcher's latest turn says ``answer:`` (after any think block), else ``search``."""
    said = (text or "").split("</think>")[-1].lower()
    return "answer" if "answer:" in said else "search"


def overlap(text: str, answer: str) -> float:
    """The share of the answer's characters (as a set) that the searcher's final turn contains: a
    dense reward, so a small model's groups differ (f1 on words is 0 for nearly every sample)."""
    said = set((text or "").split("</think>")[-1].lower())
    gold = set(str(answer).lower()) - {" "}
    return len(gold & said) / len(gold) if gold else 0.0
