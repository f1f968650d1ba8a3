"""The lm_head and the log-softmax, chunked together (objective stage, used by ``logprobs.py``).

Consumes the final hidden states of the completion positions ([c, H], what the model's lm_head
would read), the lm_head's weight (and bias), the scored token ids, the sampler's temperature per
row and a function that applies the sampler's constraint and top-k/top-p to a block of rows;
produces each row's log-prob of its token and the entropy of its distribution.

Note [Chunked head]: a plain ``lm_head`` + ``log_softmax`` + gather holds the [c, V] logits for
backward and builds another [c, V] block in it (at Qwen's V = 151,936 and 2,048 completion tokens,
1.2 GB each in float32). :class:`HeadLogSoftmax` never holds one: its forward runs the head and the
log-softmax ``rows`` rows at a time and keeps only the row log-sum-exps; its backward recomputes
each chunk's logits from the saved hidden states and weight, forms the chunk's gradient
``(onehot(target) - softmax) / T`` and turns it into the chunk's share of ``dL/dh = g W`` and
``dL/dW = g^T h`` at once. The vocabulary-sized memory is a few [rows, V] blocks, whatever ``c``;
the price is the head's matmul twice (forward and the recompute). Tied embeddings need nothing
special: the weight is a parameter like any other and its gradient adds to the embedding's.

:func:`output_head` says which models take this path: those whose ``get_output_embeddings()`` is a
plain ``torch.nn.Linear`` (not sharded, not wrapped by an adapter), and whose config does not
transform the logits after the head (soft-capping, logit scaling); the others keep the whole
block (``logprobs.py`` computes it as before). :func:`hidden_states_of` makes the model's forward
return the hidden states in place of the logits, so every layout of ``logprobs.py`` gathers them
at completion positions unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from srpo_graph.compiler.setbatch import SetBatch

# The vocabulary-sized work of one chunk: rows x V elements (float32). 2**24 = 64 MB per [rows, V]
# block: 110 rows at V = 151,936, 512 at 32,000; the forward holds 2 such blocks, the backward 3.
HEAD_CHUNK_ELEMENTS = 1 << 24

# config fields that transform the logits after the lm_head (Gemma's soft-capping, Cohere's scale,
# Granite's scaling): such models keep the unchunked path
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_softcapping", "logit_scale", "logits_scaling")

# applies the sampler's constraint and top-k/top-p, in place, to rows [start, end) of one scored part
Masker = Callable[[torch.Tensor, int, int], None]


def _allowed_mask(batch: SetBatch, vocab: int, device: torch.device) -> torch.Tensor:
    """[A, V] bool: row a marks the allowed tokens of table row a."""
    num = batch.allowed_offsets.numel() - 1
    mask = torch.zeros(num, vocab, dtype=torch.bool, device=device)
    if num:
        lengths = batch.allowed_offsets[1:] - batch.allowed_offsets[:-1]
        rows = torch.repeat_interleave(torch.arange(num), lengths.cpu()).to(device)
        mask[rows, batch.allowed_ids.to(device)] = True
    return mask


FLOOR = -1e4  # the log-prob of a token the current policy's own top-k / top-p now excludes


def _truncate_(scaled: torch.Tensor, b: SetBatch, tmem: torch.Tensor) -> None:
    """The ``sampled`` log-prob convention (backends/sampling.py Note [Log-probs of record]): rows of
    members recorded under top-k / top-p get the same filters applied to their own distribution,
    in place, so the log-softmax renormalizes over what was kept. A sampled token the filters now
    exclude gets a finite floor (no gradient), not -inf."""
    top_k = b.member_top_k.index_select(0, tmem)
    top_p = b.member_top_p.index_select(0, tmem)
    rows = ((top_k > 0) | (top_p < 1.0)).nonzero().squeeze(1)
    if not rows.numel():
        return
    from srpo_graph.backends.sampling import truncation_mask

    sub = scaled[rows]  # outside no_grad: the kept entries' gradient flows through the index_put_ below
    with torch.no_grad():
        drop = truncation_mask(torch.log_softmax(sub, dim=-1), top_k[rows], top_p[rows].to(sub.dtype))
    scaled.index_put_((rows,), sub.masked_fill(drop, float("-inf")))


def sampler_mask(b: SetBatch, tmem: torch.Tensor, allow: list[torch.Tensor]) -> Masker:
    """The function that turns rows [s, e) of a scored part's temperature-scaled logits into the
    sampler's, in place: the ``allow:`` constraint (-inf outside the allowed tokens, on the
    constrained rows only) then top-k / top-p (:func:`_truncate_`). ``allow`` caches the
    [A, V] allowed-token mask across parts."""
    allowed_row = b.member_allowed.index_select(0, tmem)

    def mask_(scaled: torch.Tensor, s: int, e: int) -> None:
        rows = allowed_row[s:e]
        constrained = (rows >= 0).nonzero().squeeze(1)
        if constrained.numel():
            if not allow or allow[0].shape[1] != scaled.shape[1]:
                allow[:] = [_allowed_mask(b, scaled.shape[1], scaled.device)]
            outside = ~allow[0][rows[constrained]]
            scaled.index_put_((constrained,), scaled[constrained].masked_fill(outside, float("-inf")))
        _truncate_(scaled, b, tmem[s:e])

    return mask_


class SelectedLogSoftmax(torch.autograd.Function):
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
        for rows, xs in zip(torch.arange(x.shape[0], device=x.device).split(SelectedLogSoftmax.CHUNK),
                            x.split(SelectedLogSoftmax.CHUNK)):
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


def output_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The lm_head of ``model`` when the chunked path can take its place (Note [Chunked head]), else None."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not torch.nn.Linear:  # none, or wrapped (a LoRA adapter on the head: its own forward)
        return None
    if type(head.weight) is not torch.nn.Parameter and type(head.weight) is not torch.Tensor:  # DTensor (FSDP)
        return None
    cfg: Any = getattr(model, "config", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for name in _LOGIT_TRANSFORMS:
        value = getattr(cfg, name, None)
        if value is not None and value != 1.0:
            return None
    return head


@contextlib.contextmanager
def hidden_states_of(head: torch.nn.Module | None) -> Iterator[None]:
    """While open, ``head`` returns its input: the model's ``.logits`` are the final hidden states
    (gathered by ``logits_to_keep`` like the logits would be). No-op for ``head=None``."""
    if head is None:
        yield
        return
    head.forward = lambda hidden: hidden  # an instance attribute shadows the class's
    try:
        yield
    finally:
        del head.forward


def chunk_rows(vocab: int, rows: int | None = None) -> int:
    """Rows per chunk: ``rows`` if given, else ``HEAD_CHUNK_ELEMENTS // vocab`` (at least 1).

    >>> chunk_rows(151_936), chunk_rows(32_000), chunk_rows(10, rows=7)
    (110, 524, 7)
    """
    return max(1, rows if rows else HEAD_CHUNK_ELEMENTS // vocab)


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, temp: torch.Tensor,
                  mask_: Masker, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows [start, end) of the sampler's logits: the head (``w``, already in ``dtype``), float32, / T, masked."""
    logits = F.linear(h[start:end].to(dtype), w, None if bias is None else bias.to(dtype))
    scaled = logits.float() / temp[start:end].unsqueeze(1)
    mask_(scaled, start, end)
    return scaled


class HeadLogSoftmax(torch.autograd.Function):
    """``log_softmax(head(h) / T, masked)[r, target[r]]`` and the (detached) entropy of each row,
    chunked over rows in forward and backward (Note [Chunked head])."""

    @staticmethod
    def forward(ctx, h, weight, bias, temp, target, mask_, rows, dtype):
        n = h.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=h.device)
        ent, lse = torch.empty_like(lp), torch.empty_like(lp)
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)  # one cast per call (none when the weight is in ``dtype``)
            for s in range(0, n, rows):
                e = min(n, s + rows)
                scaled = _chunk_logits(h, w, bias, temp, mask_, s, e, dtype)
                lse_c = torch.logsumexp(scaled, dim=-1)
                lse[s:e] = lse_c
                lp[s:e] = scaled.gather(1, target[s:e].unsqueeze(1)).squeeze(1) - lse_c
                ent[s:e] = torch.special.entr(scaled.sub_(lse_c.unsqueeze(1)).exp_()).sum(-1)  # -p log p, 0 at p = 0
                del scaled
        ctx.save_for_backward(h, weight, bias, temp, target, lse)
        ctx.mask_, ctx.rows, ctx.dtype = mask_, rows, dtype
        ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        h, weight, bias, temp, target, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(h) if need_h else None
        acc = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        dtype, n = ctx.dtype, h.shape[0]
        with torch.autocast(h.device.type, enabled=False):
            # the logits recomputed in the forward's dtype; the gradients' matmuls in the weight's (no [V, H]
            # product in another dtype to hold), accumulated in float32 for half-precision weights
            w_fwd = weight.to(dtype)
            for s in range(0, n, ctx.rows):
                e = min(n, s + ctx.rows)
                g_lp = grad_lp[s:e].unsqueeze(1)
                # d lp / d scaled = onehot(target) - softmax; d scaled / d logits = 1 / T (0 where masked: p = 0)
                g = _chunk_logits(h, w_fwd, bias, temp, ctx.mask_, s, e, dtype)
                g.sub_(lse[s:e].unsqueeze(1)).exp_().mul_(-g_lp)
                g.scatter_add_(1, target[s:e].unsqueeze(1), g_lp)
                g.div_(temp[s:e].unsqueeze(1))
                gd = g.to(acc)
                del g
                if grad_h is not None:
                    grad_h[s:e] = (gd.to(weight.dtype) @ weight).to(h.dtype)
                if grad_w is not None:  # in place: no [V, H] temporary per chunk
                    grad_w.addmm_(gd.t(), h[s:e].to(acc))
                if grad_b is not None:
                    grad_b.add_(gd.sum(0).to(acc))
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None, None)


def head_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, target: torch.Tensor, temperature: torch.Tensor,
                  mask_: Masker, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [c] (with gradients into ``hidden`` and the head) and entropies [c] (detached) of
    ``target`` under ``log_softmax(head(hidden) / temperature)``, masked by ``mask_``, ``rows``
    rows of the head at a time (None: :func:`chunk_rows`). The head runs in the autocast dtype
    when autocast is on (as ``head(hidden)`` would), else in its weight's; the log-softmax in float32."""
    dev = hidden.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else head.weight.dtype
    return HeadLogSoftmax.apply(hidden, head.weight, head.bias, temperature.float(), target, mask_,
                                chunk_rows(head.out_features, rows), dtype)
