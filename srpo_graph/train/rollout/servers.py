"""Trainer stage: rollouts on remote backends -- who stops the servers training started, the
failure budget, the backend's loss defaults, and the sampler/trainer mismatch per agent.

Which server samples for which policy is the backend's row in ``backends.BACKENDS``
(``for_training``; for SGLang ``backends/sglang_server.py::serve_policies``). Here:

* :func:`server_scope` stops every server started inside it when training ends, fails or is
  interrupted (``sglang_server``'s exit hook and parent-death signal cover a trainer that dies);
* :func:`with_backend_defaults`: the backend's ``loss_defaults``; the set-level mismatch correction
  defaults to ``tis`` on SGLang (Note [Mismatch on SGLang] in docs/sglang.md): the server samples in
  bf16 with its own kernels while the trainer recomputes in fp32, so ``old_logprobs`` != sampler
  log-probs; an explicit ``loss.mismatch`` is kept;
* the failure budget (every failure class, not only the backend's) is ``train/stops.py``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from srpo_graph.backends import backend_spec, sglang_server
from srpo_graph.errors import BackendError
from srpo_graph.train.stops import check_failure_budget


@contextlib.contextmanager
def server_scope() -> Iterator[None]:
    """Stop every SGLang server started inside the block when it exits (normally or not)."""
    before = {id(s) for s in sglang_server.live_servers()}
    try:
        yield
    finally:
        for s in sglang_server.live_servers():
            if id(s) not in before:
                s.stop()


def with_backend_defaults(config: Any) -> Any:
    """``config`` with its backend's ``loss_defaults`` (``BACKENDS[...]``) for the loss options not set
    explicitly: ``loss.mismatch = tis`` on SGLang (Note [Mismatch on SGLang] in docs/sglang.md)."""
    defaults = {k: v for k, v in backend_spec(config.rollout.backend).loss_defaults.items()
                if k not in config.loss.model_fields_set}
    if not defaults:
        return config
    coerced = type(config.loss).model_validate(defaults)  # e.g. "tis" -> Mismatch.TIS
    update = {k: getattr(coerced, k) for k in defaults}
    return config.model_copy(update={"loss": config.loss.model_copy(update=update)})


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


__all__ = ["agent_mismatch", "fresh_tokens", "check_failure_budget", "rollout_metrics", "server_scope", "with_backend_defaults", "BackendError"]
