"""Trainer stage, rollouts: the failure budget of a step's episodes.

Consumes the executor's statistics of one step's rollout and the run's config; raises
:class:`FailureBudgetExceeded` when more of the step's episodes failed -- for any reason: backend,
tool, extractor, reward, prompt, timeout, workflow (``runtime.usercode.FAILURE_KINDS``) -- than
``rollout.max_failed_fraction`` allows. The trainer turns it into a stop with the command that
resumes (``train/stops.py``).
"""

from __future__ import annotations

from typing import Any

from srpo_graph.errors import RuntimeFailure


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
        server = backend_hint(config) if "backend" in stats.failed_by_kind else ""
        raise FailureBudgetExceeded(
            f"{stats.failures} of {stats.episodes} episodes failed ({failure_summary(stats)}; {share:.0%} > "
            f"rollout.max_failed_fraction={budget:g}){server}{firsts}")


def backend_hint(config: Any) -> str:
    """Where to look after backend failures: the logs of the servers this run launched
    (``RUN_DIR/sglang/``) only when it launched some; external endpoints and connected servers keep
    their own logs (issue 39, item 4: an endpoint's stop pointed at logs that did not exist)."""
    r = config.rollout
    launched = r.backend == "sglang" and getattr(r.sglang, "launch", None) is not None
    if launched:
        return f" (the servers' logs are in {config.run_dir}/sglang/)"
    return " (each failure above names the server or endpoint; its own log says more)"


__all__ = ["FailureBudgetExceeded", "backend_hint", "check_failure_budget", "failure_summary"]
