"""Trainer stage: the policy update on one step's SetBatch (epochs x mini-batches x micro-batches).

Consumes a compiled :class:`~srpo_graph.compiler.setbatch.SetBatch`, one model + optimizer (+
scheduler) per policy id of ``batch.policies``, and the objective's config; produces updated
weights and an :class:`UpdateResult` (loss, diagnostics, grad norm per policy, skipped updates).

The order of work, as in CleanRL's PPO loop:

1. ``old_logprobs`` are recomputed with the current weights under ``no_grad``
   (:func:`recompute_old_logprobs`), micro-batch by micro-batch; for the transformers backend
   they equal the sampler's (the mismatch is returned and logged).
2. For each epoch the sets are shuffled (seeded) and cut into ``mini_batches`` mini-batches of
   whole events (``select_sets``). Each mini-batch gets ONE loss denominator
   (``loss_denominator``), passed to every micro-batch call, so the gradient does not depend on
   the micro-batch split or on the number of processes (Note [Global denominator] in
   ``parallel/collectives.py``).
3. Micro-batches accumulate gradients; then per policy: all-reduce (``ddp``; with ``fsdp`` the
   reduce-scatter runs in the last micro-batch's backward, see ``parallel/fsdp.py``), non-finite
   check, clip, optimizer and scheduler step. A non-finite loss or gradient skips the whole
   mini-batch update (for every policy) and is counted; the weights stay as they were. Weights
   made non-finite by the optimizer step itself (an overflow with finite gradients) are checked
   after the step: the step is rolled back (weights and optimizer state) and counted the same way.

Models stay in ``eval()`` mode: dropout would make the first ratio differ from 1 and the
sampler's log-probs from the trainer's (the usual choice in LLM RL trainers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from srpo_graph.compiler.setbatch import SetBatch
from srpo_graph.srpo.diagnostics import LossDiagnostics
from srpo_graph.srpo.logprobs import Layout, packed_logprobs
from srpo_graph.srpo.loss import loss_denominator, srpo_loss
from srpo_graph.srpo.options import LossConfig
from srpo_graph.train.learn.across_ranks import whole_batch
from srpo_graph.train.parallel import fsdp as fsdp_mod
from srpo_graph.train.parallel.collectives import all_reduce
from srpo_graph.train.parallel.job import DistInfo
from srpo_graph.train.parallel.strategies import make_strategy
from srpo_graph.train.policies.precision import update_forward


@dataclass
class UpdateResult:
    """What one step's update did.

    ``diagnostics`` are computed over the whole step (every micro-batch of every mini-batch of
    every epoch, combined from sums: ``LossDiagnostics.combine``; under ``--nproc N`` summed over the
    ranks first, ``across_ranks.py``, so they are the whole batch's), and again per epoch under
    ``epoch{e}/...`` (clipping can only act from epoch 2, where the ratio first leaves 1).
    """

    loss: float = 0.0
    diagnostics: dict[str, float] = field(default_factory=dict)
    grad_norm: dict[str, float] = field(default_factory=dict)  # policy -> mean pre-clip norm
    num_updates: int = 0
    skipped_updates: int = 0
    tokens: int = 0  # tokens forwarded with grad (all epochs)
    padding_forwards: int = 0  # fsdp: zero-weight forwards run to match collectives, all ranks
    warnings: list[str] = field(default_factory=list)


def diagnostics_to_dict(diag: Any, prefix: str = "") -> dict[str, float]:
    """Flatten the objective's diagnostics object into ``{name: float}`` (tensors -> floats).

    >>> diagnostics_to_dict({"clip": {"2": 0.5}, "kl": 0.1})
    {'clip/2': 0.5, 'kl': 0.1}
    """
    if hasattr(diag, "to_dict"):
        diag = diag.to_dict()
    elif hasattr(diag, "model_dump"):
        diag = diag.model_dump()
    elif hasattr(diag, "__dataclass_fields__"):
        diag = {k: getattr(diag, k) for k in diag.__dataclass_fields__}
    out: dict[str, float] = {}
    if isinstance(diag, dict):
        for k, v in diag.items():
            out.update(diagnostics_to_dict(v, f"{prefix}{k}/"))
        return out
    name = prefix.rstrip("/")
    if torch.is_tensor(diag):
        if diag.numel() == 1:
            out[name] = float(diag.item())
        else:
            for i, v in enumerate(diag.reshape(-1).tolist()):
                out[f"{name}/{i}"] = float(v)
    elif isinstance(diag, (list, tuple)):
        for i, v in enumerate(diag):
            out.update(diagnostics_to_dict(v, f"{prefix}{i}/"))
    elif isinstance(diag, (int, float)) and not isinstance(diag, bool):
        out[name] = float(diag)
    return out


def recompute_old_logprobs(models: Sequence[Any], batch: SetBatch, *, layout: Layout = "auto",
                           autocast: str = "off") -> tuple[SetBatch, dict[str, float]]:
    """``batch`` with ``old_logprobs`` recomputed by the current models, and the mismatch stats.

    ``layout``: the log-prob forward's micro-batch layout (``packed_logprobs``; same results);
    ``autocast``: ``off`` or ``bfloat16`` (train/policies/precision.py), as in the update.

    Returns:
        (batch, {"mean_abs": ..., "max_abs": ...}) where the mismatch is |old - sampler| over
        completion tokens.
    """
    parts = []
    with torch.no_grad(), update_forward(models, autocast):
        for micro in batch.micro_batches():
            lp, _ = packed_logprobs(models, micro, layout=layout)
            parts.append(lp.detach().float().cpu())
    fsdp_mod.reshard_all(models)  # a forward without backward leaves FSDP roots unsharded
    old = torch.cat(parts) if parts else torch.zeros(0)
    mask = batch.loss_mask.bool().cpu()
    diff = (old - batch.sampler_logprobs.float().cpu())[mask].abs()
    stats = {"mean_abs": float(diff.mean()) if diff.numel() else 0.0,
             "max_abs": float(diff.max()) if diff.numel() else 0.0}
    return batch.with_(old_logprobs=old.to(batch.old_logprobs.device)), stats


_PER_EPOCH = ("clip_frac", "clip_frac_upper", "clip_frac_lower", "ratio_mean", "ratio_min", "ratio_max",
              "approx_kl_k3", "clip_upper/", "clip_lower/", "ratio_mean/")


def _step_diagnostics(epoch_diags: list[LossDiagnostics]) -> dict[str, float]:
    """The step's diagnostics over all epochs, plus the clip and ratio statistics of each epoch.

    >>> _step_diagnostics([])
    {}
    """
    if not epoch_diags:
        return {}
    out = LossDiagnostics.combine(epoch_diags, "epoch").to_dict()
    for e, diag in enumerate(epoch_diags, start=1):
        for k, v in diag.to_dict().items():
            if k in _PER_EPOCH or any(k.startswith(p) for p in _PER_EPOCH if p.endswith("/")):
                out[f"epoch{e}/{k}"] = v
    return out


def _mini_batches(batch: SetBatch, num: int, generator: torch.Generator) -> list[torch.Tensor]:
    order = torch.randperm(batch.num_sets, generator=generator)
    return [chunk for chunk in torch.tensor_split(order, min(num, max(batch.num_sets, 1))) if chunk.numel()]


def _snapshot(models, optimizers, active) -> list[tuple[torch.Tensor, torch.Tensor, Any, dict]]:
    """Copies of the parameters and optimizer state the next step changes (to roll it back).

    Costs one copy of the active policies' weights and Adam moments (on their device)."""
    saved = []
    with torch.no_grad():
        for pid in active:
            opt = optimizers[pid]
            for p in models[pid].parameters():
                if p.requires_grad:
                    st = {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state.get(p, {}).items()}
                    saved.append((p, p.detach().clone(), opt, st))
    return saved


def _restore(saved) -> None:
    with torch.no_grad():
        for p, value, opt, st in saved:
            p.copy_(value)
            if st:
                opt.state[p] = st
            else:
                opt.state.pop(p, None)


def _weights_finite(models, active, dist: DistInfo) -> bool:
    """Every active parameter finite on every rank (fsdp ranks hold different shards)."""
    bad = 0.0
    with torch.no_grad():
        for pid in active:
            for p in models[pid].parameters():
                local = p.to_local() if hasattr(p, "to_local") else p  # a DTensor shard under fsdp
                if local.numel() and not bool(torch.isfinite(local).all()):
                    bad += 1.0
    return all_reduce(bad, "sum", dist) == 0.0


@dataclass
class UpdatePolicy:
    """What the update needs of one policy (the trainer's ``PolicySlot`` has the same attributes).

    Attributes:
        model: the trained model.
        optimizer: its optimizer.
        scheduler: its LR scheduler, stepped after each optimizer step (None: none).
        ref_model: the frozen reference for the KL term (None when the KL coefficient is 0).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    ref_model: Any = None


def update_policies(
    policies: Sequence[Any],
    batch: SetBatch,
    loss_config: LossConfig,
    *,
    epochs: int,
    mini_batches: int,
    grad_clip: float,
    seed: int,
    dist: DistInfo = DistInfo(),
    inject_nonfinite: bool = False,
    strategy: str = "ddp",
    layout: Layout = "auto",
    rollback_nonfinite: bool = True,
    autocast: str = "off",
) -> UpdateResult:
    """Run the epochs x mini-batches update on ``batch`` (old_logprobs already set).

    Args:
        policies: one :class:`UpdatePolicy` (or ``PolicySlot``: ``model``, ``optimizer``,
            ``scheduler``, ``ref_model``) per policy id (``batch.policies``).
        batch: the step's SetBatch.
        loss_config: the objective's configuration.
        epochs, mini_batches: passes over the batch and optimizer steps per pass.
        grad_clip: max grad norm per policy (0 = none).
        seed: seeds the mini-batch shuffling (the same on every rank).
        dist: data-parallel info; each rank back-propagates its shard of whole events.
        inject_nonfinite: debug hook, the first micro-batch loss becomes NaN.
        strategy: a key of ``strategies.STRATEGIES``: ``ddp`` (replicated models, gradients all-reduced) or ``fsdp``
        (models
            wrapped by ``fsdp.shard_model``; every rank runs matching forwards, Note
            [Matching forwards] in ``parallel/fsdp.py``).
        layout: the log-prob forward's micro-batch layout (``packed_logprobs``: Note
            [Layouts]); the same loss and gradients either way, only speed differs.
        rollback_nonfinite: keep a copy of the stepped policies' weights and Adam state during each
            optimizer step so a step that makes a weight non-finite is undone (costs that copy's
            memory); off: such a step stops the update with ``FloatingPointError``.
        autocast: ``off`` or ``bfloat16``: the forwards under bf16 autocast (train/policies/precision.py);
            checkpointed layers (``enable_gradient_checkpointing``) are checkpointed either way.
    Returns:
        UpdateResult.
    """
    models = [p.model for p in policies]
    optimizers = [p.optimizer for p in policies]
    schedulers = [p.scheduler for p in policies]
    refs = [p.ref_model for p in policies]
    ref_models = refs if any(r is not None for r in refs) else None
    gen = torch.Generator().manual_seed(seed)
    result = UpdateResult()
    epoch_diags: list[LossDiagnostics | None] = []  # this rank's, None where its shards were empty
    epoch_chunks: list[int] = []
    norms: dict[str, list[float]] = {name: [] for name in batch.policies}
    losses: list[float] = []
    strat = make_strategy(strategy, dist)
    for _ in range(epochs):
        mini_diags: list[LossDiagnostics] = []
        chunks = _mini_batches(batch, mini_batches, gen)
        epoch_chunks.append(len(chunks))
        for chunk in chunks:
            mb = batch.select_sets(chunk)
            denom = loss_denominator(mb, loss_config)  # fixed for the whole mini-batch, every rank
            active = sorted(set(mb.member_policy.tolist()))
            local = strat.shard(mb)
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            mb_loss = 0.0
            micro_diags: list[LossDiagnostics] = []
            micros = strat.micro_batches(local)
            for i, micro in enumerate(micros):
                run_models, plan = strat.begin(models, active, i, len(micros))
                if micro is None:  # this rank's shard has fewer micro-batches: forwards with weight 0
                    result.padding_forwards += strat.backward_padding(plan)
                    continue
                with update_forward(run_models, autocast):
                    new_lp, entropy = packed_logprobs(run_models, micro, layout=layout)
                ref_lp = None
                if ref_models is not None:
                    with torch.no_grad(), update_forward(ref_models, autocast):
                        ref_lp, _ = packed_logprobs(ref_models, micro, layout=layout)
                loss, diag = srpo_loss(
                    new_lp, micro, loss_config, denominator=denom, ref_logprobs=ref_lp, entropy=entropy
                )
                if inject_nonfinite:
                    loss, inject_nonfinite = loss * float("nan"), False
                result.padding_forwards += strat.backward(loss, plan)
                mb_loss += float(loss.detach())
                result.tokens += micro.num_tokens
                if diag is not None:  # always (diagnostics=True)
                    micro_diags.append(diag)
            mb_loss = all_reduce(mb_loss, "sum", dist)
            if micro_diags:
                mini_diags.append(LossDiagnostics.combine(micro_diags, "micro"))
            finite = math.isfinite(mb_loss)
            step_norms = {}
            for pid in active:
                params = [p for p in models[pid].parameters() if p.requires_grad]
                strat.reduce_grads(params)
                norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
                norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # DTensor under fsdp
                step_norms[batch.policies[pid]] = float(norm)
                finite = finite and math.isfinite(float(norm))
            strat.after_grads(models)
            if not finite:
                result.skipped_updates += 1
                result.warnings.append(f"non-finite loss or gradient (loss {mb_loss}); update skipped")
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
                continue
            saved = _snapshot(models, optimizers, active) if rollback_nonfinite else None
            for pid in active:
                optimizers[pid].step()
            if not _weights_finite(models, active, dist):  # the step itself overflowed
                if saved is None:
                    raise FloatingPointError(
                        "non-finite weights after the optimizer step (optim.rollback_nonfinite "
                        "is off, so the step cannot be undone): resume from the last checkpoint"
                    )
                _restore(saved)
                result.skipped_updates += 1
                result.warnings.append("non-finite weights after the optimizer step; update rolled back")
                continue
            for pid in active:
                if schedulers[pid] is not None:
                    schedulers[pid].step()
                norms[batch.policies[pid]].append(step_norms[batch.policies[pid]])
            losses.append(mb_loss)
            result.num_updates += 1
        epoch_diags.append(LossDiagnostics.combine(mini_diags, "mini") if mini_diags else None)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    result.padding_forwards = strat.finish(result.padding_forwards)
    result.tokens = int(all_reduce(result.tokens, "sum", dist))  # the job's, not this rank's shard
    result.loss = sum(losses) / len(losses) if losses else float("nan")
    # every rank's shard -> the whole batch's sums, maxima and minima, before any mean (across_ranks.py)
    result.diagnostics = _step_diagnostics(whole_batch(epoch_diags, epoch_chunks, batch, dist))
    result.grad_norm = {k: sum(v) / len(v) for k, v in norms.items() if v}
    return result
