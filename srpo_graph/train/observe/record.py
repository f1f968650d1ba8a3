"""Trainer stage, observing: one step's record -- what it sampled, compiled, updated and synced.

Consumes the rollout stage's :class:`~srpo_graph.train.rollout.lockstep.StepRollout`, the learner's
:class:`~srpo_graph.train.learn.step.LearnResult`, the weight version each policy had when the
step's update started, the sync's time and the evaluation's scores; produces a typed
:class:`StepRecord`. :meth:`StepRecord.to_metrics` is the one place it becomes the nested mapping
``metrics.jsonl``, TensorBoard, W&B and the progress line read (names with ``/`` after
``metrics.flatten``: ``loss/clip_frac``, ``time/update``, ``mismatch/<agent>/mean_abs``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from srpo_graph.runtime.trace import Episode
from srpo_graph.srpo.diagnostics import staleness_histogram
from srpo_graph.train.learn.step import LearnResult
from srpo_graph.train.observe.failures import failure_metrics, no_update_reason
from srpo_graph.train.observe.metrics import summarize
from srpo_graph.train.observe.mismatch import agent_mismatch, rollout_metrics
from srpo_graph.train.observe.transitions import transition_metrics
from srpo_graph.train.rollout.lockstep import StepRollout


@dataclass
class StepRecord:
    """One training step, as logged (each field's metric names in brackets).

    Attributes:
        step: the step (``step``).
        reward, reward_std: mean and std of the episodes' rewards (``reward``, ``reward_std``).
        episodes, episodes_failed, episodes_truncated: episode counts by status.
        rollout: the backend's health and failed episodes per kind (``rollout/...``).
        events: active sets in the compiled batch (``events``).
        set_size: mean set size per transition that fired (``set_size/<transition>``).
        transitions: per-transition rewards and route statistics (``reward/<t>``, ``route/...``).
        tokens: tokens in the batch (``tokens``).
        staleness: the members' staleness against the weights updated now (``staleness/...``).
        advantage: the set advantages' statistics (``advantage/...``).
        compile: the compiler's counts (``compile/...``).
        mismatch: the sampler/trainer log-prob gap (``mismatch/...``); None without an update.
        loss: the update's mean loss (``loss``); None without an update.
        loss_diagnostics: the objective's diagnostics (``loss/...``).
        grad_norm: the mean pre-clip gradient norm per policy (``grad_norm/<policy>``).
        updates: optimizer steps taken (``updates``).
        warning: what went wrong, if anything (``warning``).
        skipped_updates: optimizer steps skipped or rolled back so far in the run.
        lr: the first policy's learning rate after the step (``lr``).
        time: seconds per part (``time/rollout``, ``compile``, ``old_logprobs``, ``update``, ``sync``,
            ``step``: their sum) and ``time/wall``, the step's wall-clock time (Note [Step time]).
        throughput: generated and trained tokens per second (``throughput/...``).
        stage: the rollout stage's own (``time/rollout_wait``, ``time/clock``, ``async/...``).
        eval: the evaluation's scores at this step (``eval/...``, ``time/eval``), if it ran.
    """

    step: int
    reward: float
    reward_std: float
    episodes: int
    episodes_failed: int
    episodes_truncated: int
    rollout: dict[str, float]
    events: int
    set_size: dict[str, float]
    transitions: dict[str, float]
    tokens: int
    staleness: dict[str, Any]
    advantage: dict[str, float]
    compile: dict[str, float]
    mismatch: dict[str, float] | None
    loss: float | None
    loss_diagnostics: dict[str, float]
    grad_norm: dict[str, float] | None
    updates: int
    warning: str | None
    skipped_updates: int
    lr: float
    time: dict[str, float]
    throughput: dict[str, float]
    stage: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, float] = field(default_factory=dict)

    def to_metrics(self) -> dict[str, Any]:
        """The nested mapping the metric sinks write (``metrics.flatten`` makes it one level)."""
        out: dict[str, Any] = {"step": self.step, "reward": self.reward, "reward_std": self.reward_std,
                               "episodes": self.episodes, "episodes_failed": self.episodes_failed,
                               "episodes_truncated": self.episodes_truncated, **self.rollout,
                               "events": self.events, "set_size": self.set_size, **self.transitions,
                               "tokens": self.tokens, "staleness": self.staleness, "advantage": self.advantage,
                               **{f"compile/{k}": v for k, v in self.compile.items()}}
        if self.mismatch is not None:
            out["mismatch"] = self.mismatch
        if self.loss is not None:
            out["loss"] = self.loss
            out.update({f"loss/{k}": v for k, v in self.loss_diagnostics.items()})
        if self.grad_norm is not None:
            out["grad_norm"] = self.grad_norm
        out["updates"] = self.updates
        if self.warning is not None:
            out["warning"] = self.warning
        out.update(skipped_updates=self.skipped_updates, lr=self.lr, time=self.time, throughput=self.throughput)
        out.update(self.stage)
        out.update(self.eval)
        return out


def transition_set_sizes(episodes: list[Episode]) -> dict[str, float]:
    """Mean active-set size (outputs consumed per firing) of each transition that fired in ``episodes``:
    over training, what a ``choices[...]`` router's subsets do to the sets (before the compiler drops any).

    >>> transition_set_sizes([])
    {}
    """
    sizes: dict[str, list[int]] = {}
    for ep in episodes:
        for t in ep.transitions:
            sizes.setdefault(t.name, []).append(len(t.consumed))
    return {name: sum(v) / len(v) for name, v in sorted(sizes.items())}


# Note [Step time]: ``time/step`` is the sum of the step's parts, and with overlapped rollouts the
# rollout part (``time/rollout``, the batch's sampling) ran during earlier steps' updates, so the sum
# exceeds the time the step took (issue 39, item 6: only ``time/clock`` showed the speed). The
# headline is ``time/wall``: the wall-clock seconds of the step in the loop -- waiting for its batch,
# compile, update and sync; the evaluation, logging and checkpoint after it are not in it -- which the
# progress line shows as s/step. Synchronous runs: ``time/wall`` ~ ``time/step``.


def step_record(step: int, wf: Any, rolled: StepRollout, learned: LearnResult, versions: dict[str, int], *,
                sync_seconds: float, skipped_updates: int, lr: float, device: str = "cpu",
                wall_seconds: float | None = None) -> StepRecord:
    """The record of step ``step``.

    Args:
        wf: the workflow as the run trains it.
        rolled, learned: the step's rollout and learning.
        versions: each policy's weight version when the update started (the sync moves them on).
        sync_seconds: how long the sync took.
        skipped_updates: the run's total so far, this step's included.
        lr: the first policy's learning rate after the update.
        device: where the models live (``cuda``: the peak GPU memory joins ``throughput``).
        wall_seconds: the step's wall-clock time in the loop (``time/wall``; Note [Step time]).
    """
    episodes, stats, batch, upd = rolled.episodes, rolled.stats, learned.batch, learned.update
    rewards = [e.reward for e in episodes]
    compile_stats: dict[str, float] = {k: v for k, v in batch.stats.to_dict().items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)}
    times = {"rollout": rolled.seconds, "compile": learned.seconds_compile,
             "old_logprobs": learned.seconds_old_logprobs, "update": learned.seconds_update, "sync": sync_seconds}
    times["step"] = sum(times.values())
    if wall_seconds is not None:
        times["wall"] = wall_seconds
    gen_tokens = sum(len(o.completion_ids) for e in episodes for o in e.outputs)
    throughput = {"gen_tokens_per_s": gen_tokens / max(times["rollout"], 1e-9),
                  "train_tokens_per_s": (upd.tokens if upd is not None else 0) / max(times["update"], 1e-9)}
    if device.startswith("cuda") and torch.cuda.is_available():  # this rank's GPU, since the start
        throughput["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    warning = None
    if upd is None:
        warning = f"nothing to update: {no_update_reason(episodes)}"
    elif upd.warnings:
        warning = "; ".join(upd.warnings)
    return StepRecord(
        step=step, reward=sum(rewards) / max(1, len(rewards)), reward_std=summarize(rewards)["std"],
        episodes=len(episodes), episodes_failed=sum(e.status == "failed" for e in episodes),
        episodes_truncated=sum(e.status == "truncated" for e in episodes),
        rollout={**rollout_metrics(stats), **failure_metrics(stats)}, events=batch.num_sets,
        set_size=transition_set_sizes(episodes), transitions=transition_metrics(wf, episodes), tokens=batch.num_tokens,
        staleness=staleness_histogram(batch, versions), advantage=summarize(batch.set_advantage.tolist()),
        compile=compile_stats,
        # on the outputs sampled at these weights (overall and per agent); a stale output's gap also holds
        # the updates since it was sampled: stale_mean_abs, beside fresh_share
        mismatch=agent_mismatch(batch, versions) if upd is not None else None,
        loss=upd.loss if upd is not None else None, loss_diagnostics=dict(upd.diagnostics) if upd is not None else {},
        grad_norm=upd.grad_norm if upd is not None else None, updates=upd.num_updates if upd is not None else 0,
        warning=warning, skipped_updates=skipped_updates, lr=lr, time=times, throughput=throughput,
        stage=dict(rolled.metrics))
