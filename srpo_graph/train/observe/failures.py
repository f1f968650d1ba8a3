"""Trainer stage, observing: what a step's failures look like in metrics and on the console.

Consumes the executor's statistics of a step's rollout and its episodes; produces the
``rollout/failed/<kind>`` counts of the step's record, the first failure of each kind printed
once per run with its ``.wf`` location (:class:`FailureReport`), and why a step had nothing to
update (:func:`no_update_reason`).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def failure_metrics(stats: Any) -> dict[str, float]:
    """``rollout/failed/<kind>`` counts of a step (only the kinds that occurred)."""
    if stats is None:
        return {}
    return {f"rollout/failed/{k}": n for k, n in sorted(stats.failed_by_kind.items())}


class FailureReport:
    """Prints the first failure of each kind once per run (stderr), with its ``.wf`` location, and
    the first step where nothing could be updated (and why)."""

    def __init__(self, enabled: bool = True, out: TextIO | None = None):
        self.enabled, self.out = enabled, out
        self.seen: set[str] = set()
        self.said_no_update = False

    def _print(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.out or sys.stderr, flush=True)

    def episodes(self, step: int, stats: Any) -> None:
        if stats is None:
            return
        for kind, msg in sorted(stats.first_failure.items()):
            if kind not in self.seen:
                self.seen.add(kind)
                n = stats.failed_by_kind.get(kind, 0)
                self._print(f"srpo-graph train: step {step}: {n} of {stats.episodes} episodes failed ({kind}); "
                            f"first: {msg}\n  (each kind is reported once; counts per step in metrics.jsonl "
                            f"rollout/failed/<kind>)")

    def nothing_updated(self, step: int, why: str) -> None:
        if not self.said_no_update:
            self.said_no_update = True
            self._print(f"srpo-graph train: step {step}: nothing to update: {why} (reported once; such steps show "
                        f"`no update` in the progress line and `updates = 0` in metrics.jsonl)")


def no_update_reason(episodes: list[Any], batch_stats: Any = None) -> str:
    """Why a step has no set to train on."""
    failed = sum(e.status == "failed" for e in episodes)
    if episodes and failed == len(episodes):
        return f"every one of the {len(episodes)} episodes failed"
    return (f"no set had a non-zero advantage ({failed} of {len(episodes)} episodes failed; in every group the "
            "others had equal rewards)")


__all__ = ["FailureReport", "failure_metrics", "no_update_reason"]
