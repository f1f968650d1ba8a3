"""Log-probs of the packed stream under the current policies (objective stage).

Consumes a :class:`~srpo_graph.compiler.setbatch.SetBatch` and one causal LM per policy id
(``batch.policies[i]`` is run by ``models[i]``); produces ``logprobs[T]`` and ``entropy[T]``
on the completion tokens (0 elsewhere), with gradients flowing into each member's own
policy. Knows nothing about losses or optimizers.

Per policy, its members' token ranges are gathered into ONE packed row whose
``position_ids`` restart at 0 for each member; transformers then builds the block-diagonal
causal mask from the positions. That is exact only with ``use_cache=False`` and no 2-D
attention mask (shared/reference/transformers-cpu.md: with the cache on, results are
silently wrong). Each member's distribution is the sampler's: ``log_softmax(logits / T)``,
renormalized over its allowed tokens when the output was constrained.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch

from srpo_graph.compiler.setbatch import SetBatch


def _policy_rows(batch: SetBatch, policy: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stream indices of policy ``policy``'s tokens (members in order) and their members."""
    members = (batch.member_policy == policy).nonzero().squeeze(1)
    starts = batch.member_offsets[:-1][members]
    lengths = (batch.member_offsets[1:] - batch.member_offsets[:-1])[members]
    seg = torch.repeat_interleave(torch.arange(members.numel(), device=starts.device), lengths)
    local_off = torch.cumsum(lengths, 0) - lengths
    idx = starts[seg] + torch.arange(int(lengths.sum()), device=starts.device) - local_off[seg]
    return idx, members[seg]


def _allowed_mask(batch: SetBatch, vocab: int, device: torch.device) -> torch.Tensor:
    """[A, V] bool: row a marks the allowed tokens of table row a."""
    num = batch.allowed_offsets.numel() - 1
    mask = torch.zeros(num, vocab, dtype=torch.bool, device=device)
    if num:
        lengths = batch.allowed_offsets[1:] - batch.allowed_offsets[:-1]
        rows = torch.repeat_interleave(torch.arange(num), lengths.cpu()).to(device)
        mask[rows, batch.allowed_ids.to(device)] = True
    return mask


class _SelectedLogSoftmax(torch.autograd.Function):
    """``log_softmax(x)[r, target[r]]`` and the (detached) entropy of each row, fused.

    Saves only ``x`` and the row log-sum-exps; backward builds one [c, V] block,
    ``g * (onehot(target) - softmax(x))``, in place. A plain ``log_softmax`` + ``gather``
    keeps the [c, V] output for backward and builds two more blocks in it (the gather's
    scatter and the log-softmax gradient); the row-wise passes here are chunked.
    """

    CHUNK = 256  # rows per pass of the forward's temporaries ([CHUNK, V] each)

    @staticmethod
    def forward(ctx, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lse = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        ent = torch.empty_like(lse)
        for rows, xs in zip(torch.arange(x.shape[0], device=x.device).split(_SelectedLogSoftmax.CHUNK),
                            x.split(_SelectedLogSoftmax.CHUNK)):
            lse_c = torch.logsumexp(xs, dim=-1)
            lse[rows] = lse_c
            ent[rows] = torch.special.entr((xs - lse_c.unsqueeze(1)).exp_()).sum(-1)  # -p log p, 0 where p = 0
        lp = x.gather(1, target.unsqueeze(1)).squeeze(1) - lse
        ctx.save_for_backward(x, lse, target)
        ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp: torch.Tensor, grad_ent: torch.Tensor) -> tuple[torch.Tensor, None]:
        x, lse, target = ctx.saved_tensors
        grad = (x - lse.unsqueeze(1)).exp_().mul_(-grad_lp.unsqueeze(1))
        grad.scatter_add_(1, target.unsqueeze(1), grad_lp.unsqueeze(1))
        return grad, None


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (transformers causal LMs do)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _completion_logits(model: torch.nn.Module, ids: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[len(rows), V] logits of one packed row at positions ``rows`` only.

    With ``logits_to_keep`` the hidden states are gathered at ``rows`` before the lm_head,
    so no [tokens, V] block is ever built (prompts are usually most of the stream); other
    modules get the full forward and a gather.
    """
    if _keeps_logits(model):
        return model(input_ids=ids.unsqueeze(0), position_ids=pos.unsqueeze(0), use_cache=False,
                     logits_to_keep=rows).logits[0]
    return model(input_ids=ids.unsqueeze(0), position_ids=pos.unsqueeze(0), use_cache=False).logits[0].index_select(0, rows)


def packed_logprobs(models: Sequence[torch.nn.Module], batch: SetBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of every completion token under its member's policy.

    Args:
        models: causal LMs (transformers ``PreTrainedModel``), indexed by policy id; a policy
            with no member in the batch is not run.
        batch: the SetBatch (any device; moved to the models' device).
    Returns:
        (logprobs [T], entropy [T]) float32 on the models' device; 0 on prompt tokens.
        ``logprobs`` carries gradients; ``entropy`` is computed from the same distribution,
        detached (a diagnostic). Memory: the lm_head and the log-softmax run on completion
        positions only (hidden states are gathered there first), so the vocabulary-sized
        blocks are [completion tokens, vocab] per policy, never [tokens, vocab]; size
        micro-batches (``micro_batch_tokens``) for them.
    Raises:
        ValueError: a member's policy id has no model.
    """
    device = next(models[0].parameters()).device
    b = batch.to(device)
    T = b.num_tokens
    out_lp = torch.zeros(T, dtype=torch.float32, device=device)
    out_ent = torch.zeros(T, dtype=torch.float32, device=device)
    used = torch.unique(b.member_policy).tolist()
    if used and max(used) >= len(models):
        raise ValueError(f"batch uses policy id {max(used)} ({b.policies[max(used)]!r}) but only {len(models)} models given")
    lp_parts, ent_parts, where_parts = [], [], []
    for p in used:
        model = models[p]
        idx, mem = _policy_rows(b, p)  # [n] stream indices and members of this policy's row
        # the token at row position r is predicted by the logits at r - 1 (same member: a
        # completion token is never a member's first token, since prompts are non-empty)
        target = b.loss_mask.index_select(0, idx).nonzero().squeeze(1)  # [c] row positions of completion tokens
        tmem = mem.index_select(0, target)
        logits = _completion_logits(model, b.input_ids.index_select(0, idx), b.position_ids.index_select(0, idx),
                                    target - 1)  # [c, V]: the lm_head runs on these rows only
        # a fresh [c, V] tensor of the sampler's logits (temperature, then constraint);
        # ``logits`` is dropped so only this block stays alive
        scaled = logits.float() / b.member_temperature.index_select(0, tmem).unsqueeze(1)
        del logits
        allowed_row = b.member_allowed.index_select(0, tmem)
        constrained = (allowed_row >= 0).nonzero().squeeze(1)
        if constrained.numel():  # mask only the constrained rows ([c', V], not [c, V])
            allow = _allowed_mask(b, scaled.shape[1], device)
            outside = ~allow[allowed_row[constrained]]
            # in place: ``scaled`` is a fresh tensor that no backward formula reads
            scaled.index_put_((constrained,), scaled[constrained].masked_fill(outside, float("-inf")))
        lp, ent = _SelectedLogSoftmax.apply(scaled, b.input_ids.index_select(0, idx.index_select(0, target)))
        lp_parts.append(lp)
        ent_parts.append(ent)
        where_parts.append(idx[target])
    if where_parts:
        where = torch.cat(where_parts)
        out_lp = out_lp.index_put((where,), torch.cat(lp_parts))
        out_ent = out_ent.index_put((where,), torch.cat(ent_parts))
    return out_lp, out_ent
