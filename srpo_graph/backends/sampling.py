"""Token sampling shared by in-process backends: temperature, constraint, top-k/top-p, seeds.

Backends stage. Consumes one step of logits for a batch of rows and each row's sampling
parameters; produces the sampled token ids and their log-probs of record.

Note [Log-probs of record]
    The log-prob recorded for a sampled token is ``log_softmax(logits / T)`` over the full
    vocabulary, or over ``allowed_token_ids`` (renormalized) when the row is constrained.
    top-k / top-p only narrow what may be *sampled*; they do not renormalize the recorded
    log-prob (SGLang does the same), so the trainer can recompute it from the model alone.
    Temperature 0 is greedy; its recorded log-prob is that of ``T = 1``.

Each row draws its uniform number from its own ``torch.Generator`` (seeded per request), so the
token sampled for a request does not depend on which other requests share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowParams:
    """Sampling parameters of a batch, one entry per row (tensors of shape [B])."""

    temperature: torch.Tensor  # [B] float; 0 = greedy
    top_k: torch.Tensor  # [B] long; 0 = off
    top_p: torch.Tensor  # [B] float; 1 = off
    allowed: torch.Tensor | None  # [B, V] bool, or None when no row is constrained
    generators: list[torch.Generator]


def scaled_logprobs(logits: torch.Tensor, temperature: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Log-probs of record: ``log_softmax(logits / T)`` restricted to ``allowed`` (renormalized).

    Args:
        logits: [B, V] float logits.
        temperature: [B]; rows with 0 (greedy) use T = 1.
        allowed: [B, V] bool mask or None.
    Returns:
        [B, V] float32 log-probs (``-inf`` outside the constraint).

    >>> lp = scaled_logprobs(torch.tensor([[0.0, 0.0, 5.0]]), torch.tensor([2.0]), torch.tensor([[True, True, False]]))
    >>> [round(x, 4) for x in lp.exp()[0].tolist()]
    [0.5, 0.5, 0.0]
    """
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(torch.float32)
    z = logits.to(torch.float32) / t[:, None]
    if allowed is not None:
        z = z.masked_fill(~allowed, float("-inf"))
    return torch.log_softmax(z, dim=-1)


def _filter(logp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) what top-k / top-p exclude; rows with k=0 and p=1 are left as they are."""
    sorted_lp, order = torch.sort(logp, dim=-1, descending=True)
    vocab = logp.shape[-1]
    rank = torch.arange(vocab, device=logp.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    drop = rank >= k[:, None]
    probs = sorted_lp.exp()
    before = probs.cumsum(-1) - probs  # mass strictly above this token
    drop |= (before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    drop[:, 0] = False  # the most likely token always stays
    drop_unsorted = torch.zeros_like(drop).scatter(-1, order, drop)
    return logp.masked_fill(drop_unsorted, float("-inf"))


def sample(logits: torch.Tensor, params: RowParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    Args:
        logits: [B, V] next-token logits.
        params: per-row parameters and generators.
    Returns:
        (token ids [B] long, their log-probs of record [B] float32).
    """
    logp = scaled_logprobs(logits, params.temperature, params.allowed)  # [B, V]
    pick = logp
    if bool(((params.top_k > 0) | (params.top_p < 1.0)).any()):
        pick = _filter(logp, params.top_k, params.top_p)
    probs = pick.exp()  # [B, V]; 0 where excluded
    # one uniform per row from the row's own generator: batch composition never changes a draw
    u = torch.cat([torch.rand(1, generator=g) for g in params.generators]).to(probs.device)
    cdf = probs.cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
    last_nonzero = (probs > 0).long().cumsum(-1).argmax(-1)  # guards u*total rounding up past the end
    idx = torch.minimum(idx, last_nonzero)
    greedy = params.temperature <= 0
    if bool(greedy.any()):
        idx = torch.where(greedy, pick.argmax(-1), idx)
    return idx, logp.gather(-1, idx[:, None]).squeeze(-1)
