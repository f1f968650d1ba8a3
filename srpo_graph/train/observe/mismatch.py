"""Trainer stage, observing: the sampler/trainer log-prob gap and the rollout backend's health.

Consumes one step's compiled batch (``old_logprobs`` recomputed by the learner) and the weight
version each policy has now, and the executor's statistics; produces the ``mismatch/...`` and
``rollout/...`` entries of the step's record. On SGLang the server samples in bf16 with its own
kernels while the trainer recomputes in fp32, so the gap is not 0 (docs/sglang.md, "Mismatch on
SGLang"); an output sampled some versions ago also differs by the updates since (``stale_mean_abs``).
"""

from __future__ import annotations

from typing import Any


def rollout_metrics(stats: Any) -> dict[str, float]:
    """The rollout's backend health for metrics.jsonl (``rollout/...``)."""
    if stats is None:
        return {}
    return {"rollout/backend_failures": stats.backend_failures, "rollout/stale_outputs": stats.stale_outputs}


def fresh_tokens(batch: Any, versions: dict[str, int] | None) -> Any:
    """[T] bool: the tokens of members sampled at the weights their policy has now (``versions``:
    policy name -> current weight version; None = every token). Under overlapped rollouts a member
    sampled k versions earlier differs from the trainer's log-probs by k updates as well."""
    import torch

    lengths = (batch.member_offsets[1:] - batch.member_offsets[:-1]).cpu()
    if versions is None:
        return torch.ones(int(lengths.sum()), dtype=torch.bool)
    now = torch.tensor([int(versions.get(p, -1)) for p in batch.policies], dtype=torch.int64)
    member_fresh = batch.member_policy_version.cpu() == now[batch.member_policy.cpu()]
    return torch.repeat_interleave(member_fresh, lengths)


def agent_mismatch(batch: Any, versions: dict[str, int] | None = None) -> dict[str, float]:
    """The sampler/trainer log-prob gap: |trainer - sampler| over completion tokens, overall and per
    agent, on the tokens sampled at the trainer's current weights only (:func:`fresh_tokens`): a
    gap of numerics (bf16 server vs fp32 trainer, kernels), not of the updates since a stale output
    was sampled. Those tokens' gap is ``stale_mean_abs`` (numerics + policy drift) beside
    ``fresh_share``, the share of completion tokens that are fresh; keys of an empty selection are left out.

    ``batch`` must have ``old_logprobs`` recomputed (``update.recompute_old_logprobs``).
    Returns ``{"mean_abs", "max_abs", "<agent>/mean_abs", "<agent>/max_abs", ...}`` (under
    ``mismatch/`` in metrics).
    """
    import torch

    if not batch.num_sets or batch.member_agent is None or not batch.agents:
        return {}
    lengths = batch.member_offsets[1:] - batch.member_offsets[:-1]
    token_agent = torch.repeat_interleave(batch.member_agent.cpu(), lengths.cpu())  # [T]
    done = batch.loss_mask.bool().cpu()
    fresh = fresh_tokens(batch, versions)
    mask = done & fresh
    gap = (batch.old_logprobs.float().cpu() - batch.sampler_logprobs.float().cpu()).abs()
    out: dict[str, float] = {}
    if bool(mask.any()):
        out["mean_abs"], out["max_abs"] = float(gap[mask].mean()), float(gap[mask].max())
    if versions is not None and bool(done.any()):
        out["fresh_share"] = float(mask.sum()) / float(done.sum())
        if bool((done & ~fresh).any()):
            out["stale_mean_abs"] = float(gap[done & ~fresh].mean())
    for i, name in enumerate(batch.agents):
        sel = mask & (token_agent == i)
        if bool(sel.any()):
            out[f"{name}/mean_abs"] = float(gap[sel].mean())
            out[f"{name}/max_abs"] = float(gap[sel].max())
    return out


__all__ = ["agent_mismatch", "fresh_tokens", "rollout_metrics"]
