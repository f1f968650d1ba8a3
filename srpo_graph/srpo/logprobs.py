"""Log-probs of the packed stream under the current policies (objective stage).

Consumes a :class:`~srpo_graph.compiler.setbatch.SetBatch` and one causal LM per policy id
(``batch.policies[i]`` is run by ``models[i]``); produces ``logprobs[T]`` and ``entropy[T]``
on the completion tokens (0 elsewhere), with gradients flowing into each member's own
policy. Knows nothing about losses or optimizers.

How the members of one policy are laid out for the forward is a choice of this module only
(Note [Layouts]); the SetBatch, and so the loss, never sees it:

* ``packed`` -- ONE row whose ``position_ids`` restart at 0 for each member; transformers
  builds the block-diagonal causal mask from the positions. With a variable-length kernel
  (flash-attention's varlen, FlexAttention's block masks) attention costs the sum of the
  members' squared lengths. Exact only with ``use_cache=False`` and no 2-D attention mask
  (shared/reference/transformers-cpu.md: with the cache on, results are silently wrong).
* ``padded`` -- members sorted by length into buckets (:func:`length_buckets`), each bucket
  one right-padded [rows, L] batch with plain causal attention and no mask at all: a real
  token only ever attends to earlier real tokens of its own row, so the padding is never
  seen. This is the fast layout where no varlen kernel exists (sdpa or eager on CPU build a
  dense [n, n] float mask and attend over all n packed tokens).
* ``auto`` (the default) -- packed for flash/flex attention, padded otherwise
  (:func:`choose_layout`).

Each member's distribution is the sampler's: ``log_softmax(logits / T)``, renormalized over
its allowed tokens when the output was constrained.

Note [Layouts]: the layout only changes which rows the same per-member computations are
batched into. Every completion token's log-prob is a function of its own member's tokens,
so the results equal across layouts up to float rounding (tests/srpo/test_logprob_layouts.py
checks log-probs, losses and gradients, packed vs padded vs other bucketings, against a
one-member-at-a-time reference), and events are never split: the layout works inside a
micro-batch, per policy.
"""

from __future__ import annotations

import inspect
from typing import Literal, Sequence

import numpy as np
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


_FLOOR = -1e4  # the log-prob of a token the current policy's own top-k / top-p now excludes


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

    with torch.no_grad():
        sub = scaled[rows]
        drop = truncation_mask(torch.log_softmax(sub, dim=-1), top_k[rows], top_p[rows].to(sub.dtype))
    scaled.index_put_((rows,), sub.masked_fill(drop, float("-inf")))


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


Layout = Literal["auto", "packed", "padded"]

# attention implementations (``config._attn_implementation``) that run packed rows with a
# variable-length kernel, so packing costs nothing in attention: flash-attention's varlen
# (transformers passes cu_seqlens from the restarting position_ids) and FlexAttention's
# block-sparse masks. Every other one (sdpa, eager) gets the padded layout.
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")

# The cost of one more forward call, in padded token slots: :func:`length_buckets` opens a
# new bucket only when it saves more padding than this. Measured with the tiny model on CPU
# (benchmarks/bench_layouts.py, members of 16-195 tokens): 128 was the fastest of 0 / 32 / 128 /
# 512 / one bucket (a bucket per length took 1.9x, one bucket 2.0x, 32 and 512 1.1x).
BUCKET_OVERHEAD_TOKENS = 128


def attention_implementation(model: torch.nn.Module) -> str:
    """The attention implementation of ``model`` (or of the model it wraps); "" if none is set."""
    for m in model.modules():  # ``model`` itself first, then what it wraps
        impl = getattr(getattr(m, "config", None), "_attn_implementation", None)
        if isinstance(impl, str) and impl:
            return impl
    return ""


def choose_layout(model: torch.nn.Module, layout: Layout = "auto") -> Literal["packed", "padded"]:
    """The micro-batch layout for ``model``: ``layout`` itself unless it is ``auto``, which
    picks ``packed`` for a varlen attention kernel (``VARLEN_ATTENTION`` or a kernels-hub
    flash kernel) and ``padded`` otherwise (Note [Layouts]).

    Raises:
        ValueError: ``layout`` is not one of auto, packed, padded.
    """
    if layout in ("packed", "padded"):
        return layout
    if layout != "auto":
        raise ValueError(f"layout must be 'auto', 'packed' or 'padded', got {layout!r}")
    impl = attention_implementation(model)
    return "packed" if impl in VARLEN_ATTENTION or "flash" in impl else "padded"


def length_buckets(lengths: Sequence[int], overhead: int = BUCKET_OVERHEAD_TOKENS) -> list[list[int]]:
    """Group items by length into padded buckets, minimizing padded slots + ``overhead`` per bucket.

    A bucket of rows padded to its longest length L costs ``rows * L + overhead``; the
    exact optimum over contiguous runs of the sorted lengths is a small dynamic program
    over the distinct lengths (D of them: O(D^2) work, vectorized per step).

    Args:
        lengths: one length per item (> 0).
        overhead: the cost of one more forward call, in token slots (>= 0).
    Returns:
        Buckets of item indices, shortest lengths first; within a bucket in increasing length
        (ties in input order). Every index appears exactly once.

    >>> length_buckets([5, 30, 6, 31, 5], overhead=8)
    [[0, 4, 2], [1, 3]]
    >>> length_buckets([5, 30, 6, 31, 5], overhead=1000)
    [[0, 4, 2, 1, 3]]
    >>> length_buckets([])
    []
    """
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    distinct, counts = np.unique(np.asarray(lengths, dtype=np.float64), return_counts=True)
    rows = np.concatenate([[0.0], np.cumsum(counts)])  # rows[j] = items shorter than distinct[j]
    best = np.zeros(len(distinct) + 1)
    cut = np.zeros(len(distinct) + 1, dtype=np.int64)
    for j in range(1, len(distinct) + 1):  # the last bucket holds distinct[i..j-1], padded to distinct[j-1]
        cost = best[:j] + (rows[j] - rows[:j]) * distinct[j - 1] + overhead
        cut[j] = int(np.argmin(cost))
        best[j] = cost[cut[j]]
    bounds, j = [], len(distinct)
    while j > 0:
        bounds.append((int(rows[cut[j]]), int(rows[j])))
        j = int(cut[j])
    return [order[a:b] for a, b in reversed(bounds)]


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (transformers causal LMs do)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


_MASK_KEEP: dict[type, bool] = {}


def _keeps_logits_by_mask(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or a model it wraps) slices hidden states with transformers'
    ``slice_logits_to_keep``, which takes a [B, L] bool ``logits_to_keep`` (transformers >= 5);
    causal LMs written the older way index ``hidden[:, logits_to_keep, :]`` and cannot."""
    if not _keeps_logits(model):
        return False
    for m in model.modules():
        kind = type(m)
        if kind not in _MASK_KEEP:
            try:
                _MASK_KEEP[kind] = "slice_logits_to_keep(" in inspect.getsource(kind.forward)
            except (OSError, TypeError):  # no source (built-in or compiled module)
                _MASK_KEEP[kind] = False
        if _MASK_KEEP[kind]:
            return True
    return False


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


# One forward's worth of work: the logits of some completion tokens, with the stream index
# and the member of each (the token at stream index ``where[r]`` is scored by ``logits[r]``).
_Scored = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # logits [c, V], where [c], member [c]


def _packed_forward(model: torch.nn.Module, b: SetBatch, policy: int) -> list[_Scored]:
    """Every member of ``policy`` in one packed row (positions restarting at 0)."""
    idx, mem = _policy_rows(b, policy)  # [n] stream indices and members of this policy's row
    # the token at row position r is predicted by the logits at r - 1 (same member: a
    # completion token is never a member's first token, since prompts are non-empty)
    target = b.loss_mask.index_select(0, idx).nonzero().squeeze(1)  # [c] row positions of completion tokens
    logits = _completion_logits(model, b.input_ids.index_select(0, idx), b.position_ids.index_select(0, idx),
                                target - 1)  # [c, V]: the lm_head runs on these rows only
    return [(logits, idx.index_select(0, target), mem.index_select(0, target))]


def _padded_forward(model: torch.nn.Module, b: SetBatch, policy: int, overhead: int) -> list[_Scored]:
    """The members of ``policy`` in length buckets, one right-padded [rows, L] forward each."""
    members = (b.member_policy == policy).nonzero().squeeze(1)
    lengths = (b.member_offsets[1:] - b.member_offsets[:-1]).index_select(0, members)
    device = members.device
    out = []
    for bucket in length_buckets(lengths.tolist(), overhead):
        sel = torch.tensor(bucket, dtype=torch.int64, device=device)
        mem, n = members.index_select(0, sel), lengths.index_select(0, sel)  # [B]
        col = torch.arange(int(n.max()), device=device)  # [L]
        valid = col.unsqueeze(0) < n.unsqueeze(1)  # [B, L]: False on the right padding
        grid = (b.member_offsets.index_select(0, mem).unsqueeze(1) + col).masked_fill(~valid, 0)  # [B, L] stream index
        ids = b.input_ids[grid].masked_fill(~valid, 0)  # pad with any valid id: no real token attends to it
        pos = col.expand_as(grid)  # 0..L-1 in every row: no restart, so plain causal attention, no mask
        is_target = b.loss_mask[grid] & valid  # [B, L] completion tokens
        keep = torch.zeros_like(is_target)
        keep[:, :-1] = is_target[:, 1:]  # the logits at column t - 1 score the token at column t
        # both masks select in row-major order, so logits row r scores the token at where[r]
        where = grid[is_target]
        if _keeps_logits_by_mask(model):
            logits = model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep).logits  # [c, V]
        else:
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[keep]
        out.append((logits, where, mem.unsqueeze(1).expand_as(grid)[is_target]))
    return out


def packed_logprobs(models: Sequence[torch.nn.Module], batch: SetBatch, *, layout: Layout = "auto",
                    bucket_overhead: int = BUCKET_OVERHEAD_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of every completion token under its member's policy.

    Args:
        models: causal LMs (transformers ``PreTrainedModel``), indexed by policy id; a policy
            with no member in the batch is not run.
        batch: the SetBatch (any device; moved to the models' device); usually one
            micro-batch.
        layout: how each policy's members are batched for the forward: ``packed``,
            ``padded`` or ``auto`` (per model, :func:`choose_layout`); Note [Layouts]. The
            results do not depend on it (up to float rounding).
        bucket_overhead: the padded layout's cost of one more forward, in token slots
            (:func:`length_buckets`); 0 = a bucket per distinct length.
    Returns:
        (logprobs [T], entropy [T]) float32 on the models' device; 0 on prompt tokens.
        ``logprobs`` carries gradients; ``entropy`` is computed from the same distribution,
        detached (a diagnostic). Memory: the lm_head and the log-softmax run on completion
        positions only (hidden states are gathered there first), so the vocabulary-sized
        blocks are [completion tokens, vocab] per forward, never [tokens, vocab]; size
        micro-batches (``micro_batch_tokens``) for them.
    Raises:
        ValueError: a member's policy id has no model; an unknown ``layout``.
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
    allow = None
    for p in used:
        model = models[p]
        if choose_layout(model, layout) == "packed":
            scored = _packed_forward(model, b, p)
        else:
            scored = _padded_forward(model, b, p, bucket_overhead)
        for logits, where, tmem in scored:
            # a fresh [c, V] tensor of the sampler's logits (temperature, then constraint);
            # ``logits`` is dropped so only this block stays alive
            scaled = logits.float() / b.member_temperature.index_select(0, tmem).unsqueeze(1)
            del logits
            allowed_row = b.member_allowed.index_select(0, tmem)
            constrained = (allowed_row >= 0).nonzero().squeeze(1)
            if constrained.numel():  # mask only the constrained rows ([c', V], not [c, V])
                if allow is None or allow.shape[1] != scaled.shape[1]:
                    allow = _allowed_mask(b, scaled.shape[1], device)
                outside = ~allow[allowed_row[constrained]]
                # in place: ``scaled`` is a fresh tensor that no backward formula reads
                scaled.index_put_((constrained,), scaled[constrained].masked_fill(outside, float("-inf")))
            _truncate_(scaled, b, tmem)
            lp, ent = _SelectedLogSoftmax.apply(scaled, b.input_ids.index_select(0, where))
            lp_parts.append(lp.clamp(min=_FLOOR))  # only a now-excluded token can be below it
            ent_parts.append(ent)
            where_parts.append(where)
    if where_parts:
        where = torch.cat(where_parts)
        out_lp = out_lp.index_put((where,), torch.cat(lp_parts))
        out_ent = out_ent.index_put((where,), torch.cat(ent_parts))
    return out_lp, out_ent
