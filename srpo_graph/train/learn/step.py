"""Trainer stage, learning: one step's update from its episodes.

``learn_step`` takes the episodes the rollout stage produced (``rollout_stage.py``) and runs

    compile -> old log-probs recomputed -> epochs x mini-batches x micro-batches (update.py)
      -> every policy's weights synced to its backend (version = step) -> the step's metrics record
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from srpo_graph.compiler.compile import compile as compile_batch
from srpo_graph.runtime.trace import Episode
from srpo_graph.srpo.diagnostics import staleness_histogram
from srpo_graph.train.config.loading import TrainConfig
from srpo_graph.train.learn.update import recompute_old_logprobs, update_policies
from srpo_graph.train.observe.metrics import summarize
from srpo_graph.train.observe.transitions import transition_metrics
from srpo_graph.train.rollout.lockstep import StepRollout
from srpo_graph.train.rollout.servers import agent_mismatch, rollout_metrics
from srpo_graph.train.stops import FailureReport, failure_metrics, no_update_reason


@dataclass
class StepResult:
    """What one training step hands the loop: the metrics record (flat once logged) and the episodes."""

    record: dict[str, Any]
    episodes: list[Episode]


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


def learn_step(step: int, wf, rolled: StepRollout, slots, config: TrainConfig, compile_cfg, state, dist,
               report: FailureReport | None = None) -> StepResult:
    """Compile step ``step``'s episodes, recompute old log-probs, update every policy, sync the weights
    (version ``step``) and build the step's metrics record."""
    timings: dict[str, float] = {"rollout": rolled.seconds}
    episodes, stats = rolled.episodes, rolled.stats
    t0 = time.perf_counter()
    batch = compile_batch(episodes, compile_cfg)
    timings["compile"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    models = [s.model for s in slots]
    record: dict[str, Any] = {"step": step}
    rw = [e.reward for e in episodes]
    record["reward"] = sum(rw) / max(1, len(rw))
    record["reward_std"] = summarize(rw)["std"]
    record["episodes"] = len(episodes)
    record["episodes_failed"] = sum(e.status == "failed" for e in episodes)
    record["episodes_truncated"] = sum(e.status == "truncated" for e in episodes)
    record.update(rollout_metrics(stats))
    record.update(failure_metrics(stats))
    if report is not None:
        report.episodes(step, stats)
    gen_tokens = sum(len(o.completion_ids) for e in episodes for o in e.outputs)
    record["events"] = batch.num_sets
    record["set_size"] = transition_set_sizes(episodes)
    record.update(transition_metrics(wf, episodes))  # reward/<transition>[/<label>], route/<router>/<label>
    record["tokens"] = batch.num_tokens
    record["staleness"] = staleness_histogram(batch, {s.name: s.version for s in slots})  # vs the weights updated now
    record["advantage"] = summarize(batch.set_advantage.tolist())
    for k, v in batch.stats.to_dict().items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            record[f"compile/{k}"] = v
    if batch.num_sets:
        batch, _ = recompute_old_logprobs(models, batch, layout=config.optim.layout, autocast=config.optim.autocast)
        # on the outputs sampled at these weights (overall and per agent); a stale output's gap also holds
        # the updates since it was sampled: stale_mean_abs, beside fresh_share
        record["mismatch"] = agent_mismatch(batch, {s.name: s.version for s in slots})
        timings["old_logprobs"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        upd = update_policies(
            slots, batch, config.loss,
            epochs=config.optim.epochs, mini_batches=config.optim.mini_batches, grad_clip=config.optim.grad_clip,
            seed=config.seed * 1_000_003 + step, dist=dist, inject_nonfinite=step in config.debug.nonfinite_at_steps, strategy=config.strategy,
            layout=config.optim.layout, rollback_nonfinite=config.optim.rollback_nonfinite,
            autocast=config.optim.autocast)
        state.skipped_updates += upd.skipped_updates
        record["loss"] = upd.loss
        record.update({f"loss/{k}": v for k, v in upd.diagnostics.items()})
        record["grad_norm"] = upd.grad_norm
        record["updates"] = upd.num_updates
        if upd.warnings:
            record["warning"] = "; ".join(upd.warnings)
        train_tokens = upd.tokens
    else:
        train_tokens = 0
        why = no_update_reason(episodes)
        record["updates"] = 0
        record["warning"] = f"nothing to update: {why}"
        if report is not None:
            report.nothing_updated(step, why)
    record["skipped_updates"] = state.skipped_updates
    record["lr"] = slots[0].scheduler.get_last_lr()[0]
    timings.setdefault("old_logprobs", 0.0)
    timings["update"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in slots:  # every policy's weights move together, so one version number per step
        s.sync(step)
    timings["sync"] = time.perf_counter() - t0
    timings["step"] = sum(timings.values())
    record["time"] = timings
    record["throughput"] = {"gen_tokens_per_s": gen_tokens / max(timings["rollout"], 1e-9),
                            "train_tokens_per_s": train_tokens / max(timings["update"], 1e-9)}
    record.update(rolled.metrics)  # the rollout stage's: time/rollout_wait, time/clock, async/...
    if torch.cuda.is_available() and str(slots[0].model.device).startswith("cuda"):  # this rank's GPU, since the start
        record["throughput"]["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return StepResult(record, episodes)
