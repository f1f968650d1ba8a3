"""Trainer stage: how a run ends when it cannot go on, and the command that continues it.

Every way a run stops early prints one message ending in the exact command that continues it
(:func:`continue_command`: ``srpo-graph train <the .wf> --resume <the run folder>``; with no
checkpoint yet, ``--resume`` starts the run again from step 0 with its saved configuration):

* :class:`TrainingInterrupted`: Ctrl-C / SIGTERM in the loop;
* :class:`RunStopped`: the disk filled up, a step's episodes failed beyond the budget, a server
  died during a weight sync -- anything with a cause to fix before resuming.

And the failure accounting of a step's episodes (issue 24, item 1): :func:`check_failure_budget`
counts *every* failed episode (backend, tool, extractor, reward, prompt, timeout, workflow;
``runtime.usercode.FAILURE_KINDS``) against ``rollout.max_failed_fraction``;
:class:`FailureReport` prints the first failure of each kind once, with its ``.wf`` location.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any, TextIO

from srpo_graph.errors import RuntimeFailure, SrpoGraphError


def continue_command(workflow: str | Path, run_dir: str | Path) -> str:
    """The command that continues a run (also one with no checkpoint yet: it starts at step 0).

    >>> continue_command("wf/a b.wf", "runs/x")
    "srpo-graph train 'wf/a b.wf' --resume runs/x"
    """
    return f"srpo-graph train {shlex.quote(str(workflow))} --resume {shlex.quote(str(run_dir))}"


def _where(checkpoint: Path | None) -> str:
    if checkpoint is None:
        return "no checkpoint yet (resuming starts again from step 0 with the run's configuration)"
    return f"newest complete checkpoint: {checkpoint}"


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during the loop. Complete checkpoints are untouched (a checkpoint being
    written is a ``.tmp-`` folder that is never loaded), so ``--resume`` continues from the newest.

    Attributes:
        run_dir: the run folder.
        steps_done: steps whose metrics were written before the interrupt.
        checkpoint: the newest complete checkpoint, or None.
    """

    def __init__(self, run_dir: Path, steps_done: int, checkpoint: Path | None):
        super().__init__(f"interrupted after step {steps_done}")
        self.run_dir, self.steps_done, self.checkpoint = Path(run_dir), steps_done, checkpoint

    def advice(self, workflow: str | Path) -> str:
        """What to tell the user: where the run stands and the command that continues it."""
        head = f"srpo-graph train: interrupted after step {self.steps_done}; run folder {self.run_dir}"
        redo = ""
        if self.checkpoint is not None:
            step = int(self.checkpoint.name.split("_")[-1])
            redo = f" (steps after {step} are run again)" if step < self.steps_done else ""
            where = f"{_where(self.checkpoint)} (step {step})"
        else:
            where = _where(None)
        return f"{head}\n  {where}\n  resume: {continue_command(workflow, self.run_dir)}{redo}"


class RunStopped(SrpoGraphError):
    """The run could not go on (the disk is full, too many episodes failed, a server died during a
    weight sync); complete checkpoints are intact, ``--resume`` continues once the cause is fixed.
    ``str()`` is the first line; :meth:`advice` the whole message with the command."""

    exit_code = 1

    def __init__(self, run_dir: Path, steps_done: int, checkpoint: Path | None, cause: OSError | str,
                 remedy: str = "free space"):
        self.run_dir, self.steps_done, self.checkpoint = Path(run_dir), steps_done, checkpoint
        if isinstance(cause, OSError):
            where = f" ({cause.filename})" if cause.filename else ""
            self.reason = f"{os.strerror(cause.errno) if cause.errno else cause}{where}"
        else:
            self.reason = cause
        self.remedy = remedy
        super().__init__(f"srpo-graph train: stopped after step {steps_done}: {self.reason}")

    def advice(self, workflow: str | Path) -> str:
        return (f"{self}\n  {_where(self.checkpoint)}\n  {self.remedy}, then resume: "
                f"{continue_command(workflow, self.run_dir)}")


class FailureBudgetExceeded(RuntimeFailure):
    """More of a step's episodes failed than ``rollout.max_failed_fraction`` allows (the trainer
    turns it into :class:`RunStopped`, which knows the run folder and the command)."""


def failure_summary(stats: Any) -> str:
    """``reward 8, timeout 2`` (failed episodes per kind)."""
    return ", ".join(f"{k} {n}" for k, n in sorted(stats.failed_by_kind.items()))


def check_failure_budget(stats: Any, config: Any) -> None:
    """Stop the run when more of a step's episodes failed -- for any reason -- than the budget allows.

    Raises:
        FailureBudgetExceeded: naming the share, the budget, the count per kind and the first
            failure of each kind with its ``.wf`` location.
    """
    if stats is None or not stats.episodes or not stats.failures:
        return
    share = stats.failures / stats.episodes
    budget = config.rollout.max_failed_fraction
    if share > budget:
        firsts = "".join(f"\n  first {k} failure: {msg}" for k, msg in sorted(stats.first_failure.items()))
        server = (" (a server's log is in RUN_DIR/sglang/ when training started it)"
                  if "backend" in stats.failed_by_kind else "")
        raise FailureBudgetExceeded(
            f"{stats.failures} of {stats.episodes} episodes failed ({failure_summary(stats)}; {share:.0%} > "
            f"rollout.max_failed_fraction={budget:g}){server}{firsts}")


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


__all__ = ["FailureBudgetExceeded", "FailureReport", "RunStopped", "TrainingInterrupted", "check_failure_budget",
           "continue_command", "failure_metrics", "failure_summary", "no_update_reason"]
