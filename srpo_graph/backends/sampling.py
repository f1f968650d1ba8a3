"""Token sampling shared by in-process backends: temperature, constraint, top-k/top-p, seeds.

Backends stage. Consumes one step of logits for a batch of rows and each row's sampling
parameters; produces the sampled token ids and their log-probs of record.

Note [Log-probs of record]
    The log-prob recorded for a sampled token is ``log_softmax(logits / T)`` over the full
    vocabulary, or over ``allowed_token_ids`` (renormalized) when the row is constrained.
    Under top-k / top-p there are two conventions (``GenerationRequest.logprobs``):
    ``full`` (default; SGLang's): the filters only narrow what may be *sampled*, the record is
    the full distribution's, and the trainer recomputes it from the model alone; ``sampled``:
    the record is the truncated, renormalized distribution actually sampled, and the trainer
    applies the same filters to its own logits (``srpo/logprobs.py``), so sampler and trainer
    agree exactly at equal weights and a truncated support shows up in the ratio. The
    ``full`` record is not the behaviour distribution (off by log Z_kept per token), which the
    mismatch correction cannot see; ``sampled`` makes it explicit. Temperature 0 is greedy;
    its recorded log-prob is that of ``T = 1``.

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
    sampled_logprobs: torch.Tensor | None = None  # [B] bool: record the truncated distribution's log-prob


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


def truncation_mask(logp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[B, V] bool: the tokens top-k / top-p exclude from rows of log-probs ``logp`` (the trainer uses
    it to recompute the ``sampled`` convention exactly as :func:`sample` drew).

    >>> truncation_mask(torch.log(torch.tensor([[0.5, 0.3, 0.2]])), torch.tensor([2]), torch.tensor([1.0])).tolist()
    [[False, False, True]]
    """
    return torch.isinf(_filter(logp, top_k, top_p)) & ~torch.isinf(logp)


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
    record = logp
    if params.sampled_logprobs is not None and bool(params.sampled_logprobs.any()) and pick is not logp:
        truncated = torch.log_softmax(pick, dim=-1)  # renormalized over what top-k/top-p kept
        record = torch.where(params.sampled_logprobs[:, None], truncated, logp)
    return idx, record.gather(-1, idx[:, None]).squeeze(-1)
