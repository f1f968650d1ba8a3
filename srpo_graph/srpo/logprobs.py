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


def packed_logprobs(models: Sequence[torch.nn.Module], batch: SetBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of every completion token under its member's policy.

    Args:
        models: causal LMs (transformers ``PreTrainedModel``), indexed by policy id; a policy
            with no member in the batch is not run.
        batch: the SetBatch (any device; moved to the models' device).
    Returns:
        (logprobs [T], entropy [T]) float32 on the models' device; 0 on prompt tokens.
        ``logprobs`` carries gradients; ``entropy`` is computed from the same distribution,
        detached (a diagnostic). Memory: one [completion tokens, vocab] float32 block per
        policy, so size micro-batches (``micro_batch_tokens``) for the vocabulary.
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
        logits = model(input_ids=b.input_ids[idx].unsqueeze(0), position_ids=b.position_ids[idx].unsqueeze(0),
                       use_cache=False).logits[0]  # [n, V]
        # the token at row position r is predicted by the logits at r - 1 (same member: a
        # completion token is never a member's first token, since prompts are non-empty)
        target = b.loss_mask[idx].nonzero().squeeze(1)  # [c] row positions of completion tokens
        tmem = mem[target]
        scaled = logits[target - 1].float() / b.member_temperature[tmem].unsqueeze(1)
        allowed_row = b.member_allowed[tmem]
        constrained = (allowed_row >= 0).nonzero().squeeze(1)
        if constrained.numel():  # mask only the constrained rows ([c', V], not [c, V])
            allow = _allowed_mask(b, scaled.shape[1], device)
            outside = ~allow[allowed_row[constrained]]
            scaled = scaled.index_put((constrained,), scaled[constrained].masked_fill(outside, float("-inf")))
        logp = torch.log_softmax(scaled, dim=-1)  # [c, V]
        lp_parts.append(logp.gather(1, b.input_ids[idx[target]].unsqueeze(1)).squeeze(1))
        with torch.no_grad():  # entropy is a diagnostic: keep no [c, V] graph for it
            probs = logp.exp()
            ent_parts.append(-(probs * logp.masked_fill(probs == 0, 0.0)).sum(-1))
        where_parts.append(idx[target])
    if where_parts:
        where = torch.cat(where_parts)
        out_lp = out_lp.index_put((where,), torch.cat(lp_parts))
        out_ent = out_ent.index_put((where,), torch.cat(ent_parts))
    return out_lp, out_ent
