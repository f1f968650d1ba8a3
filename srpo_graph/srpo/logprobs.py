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
* ``prefix`` -- padded, except that members of one policy whose prompts start alike share ONE
  forward of that prefix: the G samples of a task (one prompt), a later turn and the earlier
  turns whose context it extends, an aggregator's prompt and its question
  (:func:`_shared_prefixes` picks the groups). Each group's prefix runs once, right-padded, with
  the KV cache on; the cache is repeated to its members (a differentiable gather, so the
  prefix's gradient is the sum of its members') and only the rest of each member (prompt tail
  and completion) runs per member, attending to the cached keys through a 2-D mask that hides
  the prefix padding. Prompts are most of the tokens (72-89% on the CPU study workflows;
  benchmarks/bench_layouts.py has what sharing saves). Members that share nothing take the
  padded path. Needs a model whose forward takes ``attention_mask`` and a KV cache
  (``past_key_values`` or ``cache``), full attention in every layer (no sliding window, no
  linear-attention layers) and no gradient checkpointing; others get ``padded``, and so does
  a bucket whose cache is not plain key/value layers (:func:`_can_repeat`).
* ``auto`` (the default) -- packed for flash/flex attention, otherwise prefix where the model
  takes a cache, else padded (:func:`choose_layout`).

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
from srpo_graph.srpo.lm_head import (
    FLOOR,
    SelectedLogSoftmax,
    head_logprobs,
    hidden_states_of,
    output_head,
    sampler_mask,
)


def _policy_rows(batch: SetBatch, policy: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stream indices of policy ``policy``'s tokens (members in order) and their members."""
    members = (batch.member_policy == policy).nonzero().squeeze(1)
    starts = batch.member_offsets[:-1][members]
    lengths = (batch.member_offsets[1:] - batch.member_offsets[:-1])[members]
    seg = torch.repeat_interleave(torch.arange(members.numel(), device=starts.device), lengths)
    local_off = torch.cumsum(lengths, 0) - lengths
    idx = starts[seg] + torch.arange(int(lengths.sum()), device=starts.device) - local_off[seg]
    return idx, members[seg]


Layout = Literal["auto", "packed", "padded", "prefix"]

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


def _cache_kwarg(model: torch.nn.Module) -> str | None:
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


def choose_layout(model: torch.nn.Module, layout: Layout = "auto") -> Literal["packed", "padded", "prefix"]:
    """The micro-batch layout for ``model``: ``layout`` itself unless it is ``auto``, which
    picks ``packed`` for a varlen attention kernel (``VARLEN_ATTENTION`` or a kernels-hub
    flash kernel), ``prefix`` for a model that takes a KV cache and ``padded`` otherwise
    (Note [Layouts]). ``prefix`` asked of a model without a cache is ``padded``.

    Raises:
        ValueError: ``layout`` is not one of auto, packed, padded, prefix.
    """
    if layout == "prefix":
        return "prefix" if _cache_kwarg(model) else "padded"
    if layout in ("packed", "padded"):
        return layout
    if layout != "auto":
        raise ValueError(f"layout must be 'auto', 'packed', 'padded' or 'prefix', got {layout!r}")
    impl = attention_implementation(model)
    if impl in VARLEN_ATTENTION or "flash" in impl:
        return "packed"
    return "prefix" if _cache_kwarg(model) else "padded"


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


def _padded_forward(model: torch.nn.Module, b: SetBatch, policy: int, overhead: int,
                    members: torch.Tensor | None = None) -> list[_Scored]:
    """The members of ``policy`` (or ``members``) in length buckets, one right-padded [rows, L] forward each."""
    if members is None:
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


def _logits_at(model: torch.nn.Module, keep: torch.Tensor, **inputs) -> tuple[torch.Tensor, object]:
    """One forward of ``inputs``; the logits at the True cells of ``keep`` [B, L] (row-major), and the output."""
    if _keeps_logits_by_mask(model):
        out = model(**inputs, logits_to_keep=keep)
        return out.logits, out
    out = model(**inputs)
    return out.logits[keep], out


# A shared prefix is worth a group only when it saves more than this many token slots: a group
# costs a row of the prefix forward and a cache row per member (benchmarks/bench_layouts.py).
MIN_SHARED_TOKENS = 8
# The most members one group holds: bounds the grouping's dynamic program to O(members x this) when
# every prompt starts alike (a long system prompt), at the cost of one prefix row per this many.
MAX_GROUP = 256


def _common(a: bytes, b: bytes) -> int:
    """The length, in tokens (8 bytes each), of the longest common prefix of two token strings."""
    n = min(len(a), len(b)) // 8
    lo, hi = 0, n  # binary search on bytes comparisons: C speed, O(log n) slices
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[: 8 * mid] == b[: 8 * mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _shared_prefixes(b: SetBatch, members: torch.Tensor, min_saved: int = MIN_SHARED_TOKENS
                     ) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """Group ``members`` (of one policy) by a prefix of their prompts (the tokens before each one's
    first completion token) so that each group's prefix runs once.

    The prompts are sorted; a group is a run of neighbours and its prefix their longest common
    prefix, so the G samples of a task share their whole prompt, a later turn shares its earlier
    turns' context, and a dynamic program over the runs keeps the grouping that skips the most
    prefix tokens (``(size - 1) * prefix`` per group, less ``min_saved``): one group per task
    beats one group per template when the questions are longer than the template. A prefix
    shorter than ``min_saved`` tokens is not shared, and a group holds at most ``MAX_GROUP``
    members.

    Returns:
        (groups, alone): ``(prefix length, members)`` of each group, and the members in none
        (no prefix worth sharing, or no completion token).
    """
    off = b.member_offsets.tolist()
    ids = b.input_ids.cpu().numpy().astype(">i8")  # big-endian: the bytes sort as the token ids do
    comp = b.loss_mask.nonzero().squeeze(1).cpu()
    first = torch.full((b.num_members,), -1, dtype=torch.int64)
    if comp.numel():  # each member's first completion token: a segment minimum
        owner = torch.searchsorted(b.member_offsets[1:].cpu(), comp, right=True)
        first = first.scatter_reduce(0, owner, comp, reduce="amin", include_self=False)
    alone: list[int] = []
    prompts: list[tuple[bytes, int]] = []
    for m in members.tolist():
        s, f = off[m], int(first[m])
        if f <= s:  # no completion token: nothing to score
            alone.append(m)
        else:
            prompts.append((ids[s:f].tobytes(), m))
    prompts.sort()
    n = len(prompts)
    lcp = [_common(prompts[i][0], prompts[i + 1][0]) for i in range(n - 1)]  # of neighbours i, i + 1
    best = [0] * (n + 1)  # best[j]: the most tokens saved on the first j prompts
    cut: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # (start of the last group, its prefix; 0 = alone)
    for j in range(1, n + 1):
        best[j], cut[j] = best[j - 1], (j - 1, 0)
        common = 1 << 62
        for i in range(j - 2, max(-1, j - 1 - MAX_GROUP), -1):  # the group prompts[i..j-1]
            common = min(common, lcp[i])
            if common < min_saved:
                break  # a prefix shorter than min_saved is not shared (and they only get shorter)
            gain = best[i] + common * (j - 1 - i) - min_saved
            if gain > best[j]:
                best[j], cut[j] = gain, (i, common)
    groups = []
    j = n
    while j > 0:
        i, common = cut[j]
        if common:
            groups.append((common, [prompts[k][1] for k in range(i, j)]))
        else:
            alone.extend(prompts[k][1] for k in range(i, j))
        j = i
    return groups[::-1], sorted(alone)


def _prefix_forward(model: torch.nn.Module, b: SetBatch, policy: int, overhead: int) -> list[_Scored]:
    """The ``prefix`` layout (Note [Layouts]): each group's shared prefix runs once, the rest of its
    members attends to the repeated KV cache; the members that share nothing go the padded way."""
    from srpo_graph.backends.transformers import cache_of

    cache_kw = _cache_kwarg(model)
    assert cache_kw is not None  # choose_layout only picks prefix for a model that takes a cache
    members = (b.member_policy == policy).nonzero().squeeze(1)
    device = members.device
    groups, alone = _shared_prefixes(b, members)
    out = _padded_forward(model, b, policy, overhead, torch.tensor(alone, dtype=torch.int64, device=device))
    if not groups:
        return out
    for bucket in length_buckets([p for p, _ in groups], overhead):
        plen = torch.tensor([groups[g][0] for g in bucket], device=device)  # [G] prefix lengths
        first = torch.tensor([groups[g][1][0] for g in bucket], device=device)  # a member of each group
        mem = torch.tensor([m for g in bucket for m in groups[g][1]], device=device)  # [M] the groups' members
        gidx = torch.repeat_interleave(torch.arange(len(bucket), device=device),
                                       torch.tensor([len(groups[g][1]) for g in bucket], device=device))  # [M]
        # 1. the shared prefixes, right-padded (plain causal attention: a real token never sees the padding)
        col = torch.arange(int(plen.max()), device=device)
        pvalid = col.unsqueeze(0) < plen.unsqueeze(1)  # [G, P]
        grid = (b.member_offsets.index_select(0, first).unsqueeze(1) + col).masked_fill(~pvalid, 0)
        last = torch.zeros_like(pvalid)
        last[torch.arange(len(bucket), device=device), plen - 1] = True  # scores the token after each prefix
        first_logits, pout = _logits_at(model, last, input_ids=b.input_ids[grid].masked_fill(~pvalid, 0),
                                        position_ids=col.expand_as(grid), use_cache=True)
        cache = cache_of(pout)
        if not _can_repeat(cache):  # a cache this layout cannot repeat: these members go the padded way
            out += _padded_forward(model, b, policy, overhead, mem)
            continue
        starts = b.member_offsets.index_select(0, mem) + plen.index_select(0, gidx)  # [M] each member's first token after it
        scored = b.loss_mask.index_select(0, starts).nonzero().squeeze(1)  # members whose prompt IS the prefix
        if scored.numel():  # the prefix's last logits score their first completion token
            out.append((first_logits.index_select(0, gidx.index_select(0, scored)), starts.index_select(0, scored),
                        mem.index_select(0, scored)))
        # 2. the rest of each member (prompt tail and completion but the last token, whose logits
        # score nothing), in length buckets of their own, each attending to its rows of the prefix cache
        rest = b.member_offsets.index_select(0, mem + 1) - starts - 1  # [M]
        todo = (rest > 0).nonzero().squeeze(1)  # a one-token completion right after the prefix: scored above
        for sub in length_buckets(rest.index_select(0, todo).tolist(), overhead):
            rows = todo.index_select(0, torch.tensor(sub, dtype=torch.int64, device=device))  # into mem
            r_len, r_start, r_group = rest.index_select(0, rows), starts.index_select(0, rows), gidx.index_select(0, rows)
            scol = torch.arange(int(r_len.max()), device=device)
            svalid = scol.unsqueeze(0) < r_len.unsqueeze(1)  # [R, S]
            sgrid = (r_start.unsqueeze(1) + scol).masked_fill(~svalid, 0)  # [R, S] stream index
            target = b.loss_mask[sgrid + 1] & svalid  # the token after each cell is a completion token
            mask = torch.cat([pvalid.index_select(0, r_group), torch.ones_like(svalid)], dim=1).long()  # hide prompt padding
            logits, _ = _logits_at(model, target, input_ids=b.input_ids[sgrid].masked_fill(~svalid, 0),
                                   position_ids=plen.index_select(0, r_group).unsqueeze(1) + scol, attention_mask=mask,
                                   use_cache=True, **{cache_kw: _repeat_cache(cache, r_group)})
            out.append((logits, (sgrid + 1)[target], mem.index_select(0, rows).unsqueeze(1).expand_as(sgrid)[target]))
    return out


def _can_repeat(cache) -> bool:
    """Whether :func:`_repeat_cache` can repeat ``cache``'s rows: a transformers ``DynamicCache`` of
    plain key/value layers (>= 4.56). Others (legacy tuples, linear-attention or shared-KV layers,
    indexed or offloaded caches) are not: the padded layout takes their members."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:  # transformers < 4.56: caches without layers
        return False
    layers = list(getattr(cache, "layers", None) or ())
    return (type(cache) is DynamicCache and bool(layers)
            and all(type(layer) is DynamicLayer and layer.keys is not None for layer in layers))


def _repeat_cache(cache, rows: torch.Tensor):
    """A new KV cache whose row r is ``cache``'s row ``rows[r]`` (a gather: gradients flow back to
    ``cache``, which is left as it was). Only for a cache that :func:`_can_repeat`."""
    return type(cache)(ddp_cache_data=[(layer.keys.index_select(0, rows), layer.values.index_select(0, rows))
                                       for layer in cache.layers])


def packed_logprobs(models: Sequence[torch.nn.Module], batch: SetBatch, *, layout: Layout = "auto",
                    bucket_overhead: int = BUCKET_OVERHEAD_TOKENS, head_chunk: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of every completion token under its member's policy.

    Args:
        models: causal LMs (transformers ``PreTrainedModel``), indexed by policy id; a policy
            with no member in the batch is not run.
        batch: the SetBatch (any device; moved to the models' device); usually one
            micro-batch.
        layout: how each policy's members are batched for the forward: ``packed``,
            ``padded``, ``prefix`` or ``auto`` (per model, :func:`choose_layout`); Note
            [Layouts]. The results do not depend on it (up to float rounding).
        bucket_overhead: the padded and prefix layouts' cost of one more forward, in token slots
            (:func:`length_buckets`); 0 = a bucket per distinct length.
        head_chunk: completion rows per chunk of the lm_head + log-softmax (Note [Chunked head]
            in ``lm_head.py``): None = about 2**24 logits per chunk, 0 = no chunking (the whole
            [completion tokens, V] block, held for backward). Same results either way.
    Returns:
        (logprobs [T], entropy [T]) float32 on the models' device; 0 on prompt tokens.
        ``logprobs`` carries gradients; ``entropy`` is computed from the same distribution,
        detached (a diagnostic). Memory: the lm_head and the log-softmax run on completion
        positions only (hidden states are gathered there first), ``head_chunk`` rows at a
        time in forward and backward, so no [tokens, V] block is held (models whose head is
        not a plain Linear, e.g. FSDP-sharded or LoRA-wrapped, get the whole [completion
        tokens, V] block per forward: size micro-batches for them).
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
    allow: list[torch.Tensor] = []  # the [A, V] allowed-token mask, built on first use
    for p in used:
        model = models[p]
        chosen = choose_layout(model, layout)
        head = output_head(model) if head_chunk != 0 else None  # Note [Chunked head]
        with hidden_states_of(head):  # with a head: ``logits`` below are hidden states [c, H]
            if chosen == "packed":
                scored = _packed_forward(model, b, p)
            elif chosen == "prefix":
                scored = _prefix_forward(model, b, p, bucket_overhead)
            else:
                scored = _padded_forward(model, b, p, bucket_overhead)
        for logits, where, tmem in scored:
            target = b.input_ids.index_select(0, where)
            temp = b.member_temperature.index_select(0, tmem)
            mask_ = sampler_mask(b, tmem, allow)
            if head is not None:
                lp, ent = head_logprobs(logits, head, target, temp, mask_, head_chunk)
            else:
                # a fresh [c, V] tensor of the sampler's logits (temperature, then constraint);
                # ``logits`` is dropped so only this block stays alive
                scaled = logits.float() / temp.unsqueeze(1)
                del logits
                mask_(scaled, 0, scaled.shape[0])  # in place: ``scaled`` is a fresh tensor that no backward formula reads
                lp, ent = SelectedLogSoftmax.apply(scaled, target)
            lp_parts.append(lp.clamp(min=FLOOR))  # only a now-excluded token can be below it
            ent_parts.append(ent)
            where_parts.append(where)
    if where_parts:
        where = torch.cat(where_parts)
        out_lp = out_lp.index_put((where,), torch.cat(lp_parts))
        out_ent = out_ent.index_put((where,), torch.cat(ent_parts))
    return out_lp, out_ent
