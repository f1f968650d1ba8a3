"""Trainer stage, parallel: the ``fsdp`` strategy's plumbing (FSDP2, ``torch.distributed.fsdp.fully_shard``).

Consumes the policy models (transformers causal LMs) and :class:`DistInfo`; produces sharded
models (each rank holds 1/N of every parameter, gradient and Adam moment), the ordering and
resharding helpers the update needs (``strategies.FullySharded``), and full (unsharded) state
dicts (the sync stage, ``train/sync.py``, refreshes rank 0's replica from them).

How it keeps the single-process result (the same contract as the ``ddp`` strategy, Note
[Global denominator] in ``collectives.py``):

* each rank back-propagates its shard of whole events with the loss divided by the mini-batch's
  global denominator; FSDP's reduce-scatter AVERAGES gradients over ranks, so the local loss is
  multiplied by the world size before ``backward`` (:data:`loss_scale`), which turns the average
  into the single-process sum;
* gradient sync (the reduce-scatter) happens only on the last micro-batch of a mini-batch
  (``set_requires_gradient_sync``); earlier micro-batches accumulate unsharded gradients;
* FSDP all-gathers parameters in every forward and reduce-scatters in every backward, so
  Note [Matching forwards] must hold.

Note [Matching forwards]: collectives are matched by order, so every rank must run the same
number of forwards of the same policies in the same order per mini-batch, although its shard
may have fewer micro-batches or no member of some policy. Ranks therefore pad to the largest
micro-batch count and, per micro-batch, run every policy active in the mini-batch in policy-id
order; a policy without local members gets a one-token forward whose output enters the loss
with weight 0 (:func:`ordered_models`). Its gradient is exactly 0, so results do not change.

Rank 0 samples. With an in-process backend (transformers) it samples from an unsharded replica
(built with the policies, ``policies/slots.py``) that the sync stage refreshes from the gathered
full state dict after every step (exact, no drift; memory: one full copy of each policy on rank 0
-- sampling in process needs the whole model somewhere). With a server backend (SGLang) there is
no replica: the sync streams the weights one gathered bucket at a time (``gather.py``,
``train/sync.py``), and checkpoints are written sharded (``checkpoint/sharded.py``), so no rank
ever holds a full model. Frozen reference models (KL) are not sharded.
"""

from __future__ import annotations

from typing import Any, Sequence, cast

import torch

from srpo_graph.train.parallel.job import DistInfo


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """Wrap ``model`` with ``fully_shard``: each decoder layer, then the root (embeddings, norm,
    lm_head; tied weights stay one parameter). Call before building the optimizer.

    Returns:
        The same module object, now an ``FSDPModule`` with DTensor parameters.
    """
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    for layer in layers if layers is not None else ():
        fully_shard(layer)
    fully_shard(model)
    return model


def is_sharded(model: Any) -> bool:
    """Whether ``model`` was wrapped by :func:`shard_model`.

    >>> is_sharded(torch.nn.Linear(1, 1))
    False
    """
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def reshard_all(models: Sequence[Any]) -> None:
    """Put every FSDP module of ``models`` back in its sharded state (no-op for plain models).

    Needed after a forward without backward (``no_grad``): FSDP2 leaves the root unsharded
    after its forward, and the optimizer steps the *sharded* parameters, so a root left
    unsharded would keep computing with stale weights.
    """
    for m in models:
        for sub in m.modules() if is_sharded(m) else ():
            if is_sharded(sub):
                sub.reshard()


def loss_scale(dist: DistInfo) -> float:
    """Factor on the local loss so FSDP's averaged gradient is the sum over ranks.

    >>> loss_scale(DistInfo(rank=1, world_size=4))
    4.0
    """
    return float(dist.world_size)


def set_gradient_sync(models: Sequence[Any], on: bool) -> None:
    """Reduce-scatter gradients in the next backward (``on``) or only accumulate them."""
    for m in models:
        if is_sharded(m):
            m.set_requires_gradient_sync(on)


def _dummy_forward(model: torch.nn.Module) -> torch.Tensor:
    """A one-token forward whose (zero-weighted) output joins the loss: Note [Matching forwards]."""
    dev = next(model.parameters()).device
    ids = torch.zeros(1, 1, dtype=torch.long, device=dev)
    return model(input_ids=ids, position_ids=ids, use_cache=False).logits.float().sum() * 0.0


class _Ordered(torch.nn.Module):
    """Runs the pending dummy forwards of lower policy ids before its own policy's forward."""

    def __init__(self, pid: int, model: torch.nn.Module, plan: "_Plan"):
        super().__init__()
        self.pid, self.inner, self.plan = pid, model, plan

    def forward(self, input_ids, position_ids=None, use_cache=False, logits_to_keep=0):
        self.plan.run_dummies_before(self.pid)
        self.plan.done.add(self.pid)
        return self.inner(input_ids=input_ids, position_ids=position_ids, use_cache=use_cache,
                          logits_to_keep=logits_to_keep)


class _Plan:
    def __init__(self, models: Sequence[torch.nn.Module], active: Sequence[int]):
        self.models, self.active = models, sorted(active)
        self.done: set[int] = set()
        self.extra: list[torch.Tensor] = []

    def run_dummies_before(self, pid: int) -> None:
        for q in self.active:
            if q < pid and q not in self.done:
                self.done.add(q)
                self.extra.append(_dummy_forward(self.models[q]))

    def finish(self) -> torch.Tensor | None:
        """Dummy forwards of the active policies not run yet; the zero term for the loss."""
        self.run_dummies_before(max(self.active, default=-1) + 1)
        return sum(self.extra[1:], self.extra[0]) if self.extra else None


def ordered_models(models: Sequence[torch.nn.Module], active: Sequence[int]) -> tuple[list[Any], _Plan]:
    """Models to pass to ``packed_logprobs`` so every active policy runs once, in id order.

    Returns:
        (models for ``packed_logprobs``, plan); call ``plan.finish()`` after ``packed_logprobs``
        and add the returned zero term (if any) to the loss before ``backward``.
    """
    plan = _Plan(models, active)
    return [_Ordered(i, m, plan) for i, m in enumerate(models)], plan


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on rank 0 (CPU), empty on other ranks. A collective: every rank
    must call it. For an unsharded model, ``model.state_dict()``."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return cast(dict[str, torch.Tensor], full)  # full_state_dict=True: every value is a plain tensor
