"""The forwards under the log-prob layouts (logprobs.py, Note [Layouts]): length buckets, and one
policy's members run packed (one row, positions restarting) or padded (length buckets of
right-padded rows), each returning the logits (or, under a chunked head, the hidden states) of
the completion tokens only, with where each one is in the stream and its member.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import numpy as np
import torch

from srpo_graph.compiler.setbatch import SetBatch

# The cost of one more forward call, in padded token slots: :func:`length_buckets` opens a
# new bucket only when it saves more padding than this. Measured with the tiny model on CPU
# (benchmarks/bench_layouts.py, members of 16-195 tokens): 128 was the fastest of 0 / 32 / 128 /
# 512 / one bucket (a bucket per length took 1.9x, one bucket 2.0x, 32 and 512 1.1x).
BUCKET_OVERHEAD_TOKENS = 128


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


def policy_rows(batch: SetBatch, policy: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stream indices of policy ``policy``'s tokens (members in order) and their members."""
    members = (batch.member_policy == policy).nonzero().squeeze(1)
    starts = batch.member_offsets[:-1][members]
    lengths = (batch.member_offsets[1:] - batch.member_offsets[:-1])[members]
    seg = torch.repeat_interleave(torch.arange(members.numel(), device=starts.device), lengths)
    local_off = torch.cumsum(lengths, 0) - lengths
    idx = starts[seg] + torch.arange(int(lengths.sum()), device=starts.device) - local_off[seg]
    return idx, members[seg]


def _full_attention_only(model: torch.nn.Module) -> bool:
    """Whether every layer of ``model`` is plain full attention: no sliding window (Mistral-style
    ``sliding_window``, Qwen2's ``use_sliding_window``), no chunked attention (Llama 4), no
    linear-attention or other non-attention layers (``layer_types`` other than ``full_attention``,
    e.g. Qwen3.5's hybrid), whose cache the prefix layout cannot repeat or whose state its
    padding would enter."""
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is None or not hasattr(cfg, "to_dict"):
            continue
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
            return False
        if getattr(cfg, "attention_chunk_size", None) is not None:
            return False
        return getattr(cfg, "sliding_window", None) is None or not getattr(cfg, "use_sliding_window", True)
    return True


def cache_kwarg(model: torch.nn.Module) -> str | None:
    """The name under which ``model.forward`` takes a KV cache (``past_key_values``, or ``cache``
    for the role adapters' wrapper), or None when it takes no cache or no ``attention_mask``, runs
    with gradient checkpointing (transformers then turns the cache off in training) or has a
    layer that is not plain full attention (:func:`_full_attention_only`)."""
    params = inspect.signature(model.forward).parameters
    if "attention_mask" not in params:
        return None
    # transformers' own test (``is_activation_checkpointing``): a module flagged ``gradient_checkpointing``
    if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        return None
    if not _full_attention_only(model):
        return None
    return next((k for k in ("past_key_values", "cache") if k in params), None)


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


def _completion_logits(model: torch.nn.Module, ids: torch.Tensor, pos: torch.Tensor,
                       rows: torch.Tensor) -> torch.Tensor:
    """[len(rows), V] logits of one packed row at positions ``rows`` only.

    With ``logits_to_keep`` the hidden states are gathered at ``rows`` before the lm_head,
    so no [tokens, V] block is ever built (prompts are usually most of the stream); other
    modules get the full forward and a gather.
    """
    if _keeps_logits(model):
        return model(
            input_ids=ids.unsqueeze(0), position_ids=pos.unsqueeze(0), use_cache=False, logits_to_keep=rows
        ).logits[0]
    return (
        model(input_ids=ids.unsqueeze(0), position_ids=pos.unsqueeze(0), use_cache=False)
        .logits[0]
        .index_select(0, rows)
    )


# One forward's worth of work: the logits of some completion tokens, with the stream index
# and the member of each (the token at stream index ``where[r]`` is scored by ``logits[r]``).
Scored = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # logits [c, V], where [c], member [c]


def packed_forward(model: torch.nn.Module, b: SetBatch, policy: int) -> list[Scored]:
    """Every member of ``policy`` in one packed row (positions restarting at 0)."""
    idx, mem = policy_rows(b, policy)  # [n] stream indices and members of this policy's row
    # the token at row position r is predicted by the logits at r - 1 (same member: a
    # completion token is never a member's first token, since prompts are non-empty)
    target = b.loss_mask.index_select(0, idx).nonzero().squeeze(1)  # [c] row positions of completion tokens
    logits = _completion_logits(
        model, b.input_ids.index_select(0, idx), b.position_ids.index_select(0, idx), target - 1
    )  # [c, V]: the lm_head runs on these rows only
    return [(logits, idx.index_select(0, target), mem.index_select(0, target))]


def padded_forward(model: torch.nn.Module, b: SetBatch, policy: int, overhead: int) -> list[Scored]:
    """The members of ``policy`` in length buckets, one right-padded [rows, L] forward each."""
    members = (b.member_policy == policy).nonzero().squeeze(1)
    if not members.numel():
        return []
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


def logits_at(model: torch.nn.Module, keep: torch.Tensor, **inputs) -> tuple[torch.Tensor, object]:
    """One forward of ``inputs``; the logits at the True cells of ``keep`` [B, L] (row-major), and the output."""
    if _keeps_logits_by_mask(model):
        out = model(**inputs, logits_to_keep=keep)
        return out.logits, out
    out = model(**inputs)
    return out.logits[keep], out
