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
* ``prefix`` -- padded, except that what members of one policy share, token for token, runs
  once: the G samples of a task (one prompt), an aggregator's prompt and its question, and a
  chat agent's turns, whose turn k prompt is turn k-1's prompt + its sampled completion + the new
  messages (runtime/chat.py). The unit is a member's INPUT, its tokens but the last (the logits
  at positions first completion - 1 .. len - 2 score its completion), so :func:`_prefix_tree`
  builds the prefix tree of the inputs (nested: a task's prompt, then each sample's first turn,
  then its second turn, ...; a node wherever sharing saves ``MIN_SHARED_TOKENS`` slots) and an
  earlier turn's completion is scored from the rows its later turn runs anyway. A policy whose
  tree would run more than ``MAX_TREE_SHARE`` of its tokens takes the padded way. The tree runs
  level by level (:func:`_prefix_forward`): each level's segments right-padded in length
  buckets, the KV cache on; a node's cache rows are repeated to the segments that continue it
  (a differentiable gather, so a shared row's gradient is the sum of its readers') and those
  attend to them through a 2-D mask hiding the padding above. Prompts are most of the tokens
  (72-89% on the CPU study workflows) and chat turns repeat each other:
  benchmarks/bench_layouts.py and benchmarks/bench_chat_prefix.py have what sharing saves.
  Needs a model whose forward takes ``attention_mask`` and a KV cache (``past_key_values`` or
  ``cache``), full attention in every layer (no sliding window, no linear-attention layers) and
  no gradient checkpointing; others get ``padded``, and so does a policy whose cache is not
  plain key/value layers (:func:`_can_repeat`).
* ``auto`` (the default) -- packed for flash/flex attention, otherwise prefix where the model
  takes a cache, else padded (:func:`choose_layout`).

Each member's distribution is the sampler's: ``log_softmax(logits / T)``, renormalized over
its allowed tokens when the output was constrained.

Note [Layouts]: the layout only changes which rows the same per-member computations are
batched into. Every completion token's log-prob is a function of its own member's tokens,
so the results equal across layouts up to float rounding (tests/srpo/test_logprob_layouts.py
checks log-probs, losses and gradients, packed vs padded vs other bucketings, against a
one-member-at-a-time reference), and events are never split: the layout works inside a
micro-batch, per policy (so the prefix tree shares only within one micro-batch). In the
``prefix`` layout several members may read one hidden state (a cell of a shared node): it is the
same function of the same tokens for each of them, so nothing changes but the count of
forwards, and its gradient is the sum of theirs, as if each had run it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
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


def _padded_forward(model: torch.nn.Module, b: SetBatch, policy: int, overhead: int) -> list[_Scored]:
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


def _logits_at(model: torch.nn.Module, keep: torch.Tensor, **inputs) -> tuple[torch.Tensor, object]:
    """One forward of ``inputs``; the logits at the True cells of ``keep`` [B, L] (row-major), and the output."""
    if _keeps_logits_by_mask(model):
        out = model(**inputs, logits_to_keep=keep)
        return out.logits, out
    out = model(**inputs)
    return out.logits[keep], out


# A node of the prefix tree is worth its own forward rows only when sharing it saves at least this
# many token slots: a node costs a row of its level's forward, a cache row per child, and often one
# more level of forwards. Measured with min_saved 8 / 16 / 32 (CPU, one thread, loaded: 0.04 is
# noise): tinymath_select's step (benchmarks/bench_layouts.py) ran 0.26 / 0.31 / 0.39x of its tokens
# in 0.47 / 0.48 / 0.52x the padded layout's time, the chat rollout (benchmarks/bench_chat_prefix.py,
# qwen3-test) 0.27 / 0.29 / 0.30x in 0.62 / 0.58 / 0.62x.
MIN_SHARED_TOKENS = 16
# The tree runs only where it runs at most this share of the policy's tokens; otherwise the padded
# layout does: a level under the root attends through a repeated cache and a 2-D mask (no plain
# causal kernel path), which costs more than a little sharing saves. On benchmarks/bench_layouts.py's
# single16 step (3-token prompts, samples alike in their first tokens) the tree ran 0.83x the
# tokens in 1.08x the time; on tinymath_select it runs 0.31x, on the chat rollout 0.29x.
MAX_TREE_SHARE = 0.75


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


@dataclass
class _PrefixTree:
    """The prefix layout's plan for the members of one policy (Note [Layouts]): segments of
    sequence positions, each run once. A segment is a NODE (positions [start, end) that every
    member under it shares, token for token) or a member's TAIL (its own positions from its
    deepest node's end to the end of its input). A member's path -- its nodes from the root, then
    its tail if it has one -- covers its input positions 0 .. len - 2 exactly once; the hidden
    state at position p of that path scores its token p + 1.

    Per segment (index g): ``start[g]``, ``end[g]`` sequence positions; ``rep[g]`` a member under
    it (its stream offset + start are the segment's tokens); ``parent[g]`` the node it continues
    (-1: it starts at position 0, no cache); ``children[g]`` the segments continuing a node.
    ``last[m]``: member m's deepest segment (its tail, or the node its input ends with); members
    with no completion token are in no path.
    """

    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    rep: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    children: list[list[int]] = field(default_factory=list)
    last: dict[int, int] = field(default_factory=dict)

    def add(self, start: int, end: int, rep: int, parent: int) -> int:
        """A new segment (under ``parent``, -1 for none); its index."""
        self.start.append(start)
        self.end.append(end)
        self.rep.append(rep)
        self.parent.append(parent)
        self.children.append([])
        if parent >= 0:
            self.children[parent].append(len(self.start) - 1)
        return len(self.start) - 1

    @property
    def num_tokens(self) -> int:
        """Tokens the layout runs for these members (every segment once; no padding counted)."""
        return sum(self.end) - sum(self.start)

    def path(self, member: int) -> list[int]:
        """The segments of ``member``'s path, root first (empty if it has no completion token)."""
        out, g = [], self.last.get(member, -1)
        while g >= 0:
            out.append(g)
            g = self.parent[g]
        return out[::-1]


def _prefix_tree(b: SetBatch, members: torch.Tensor, min_saved: int | None = None) -> _PrefixTree:
    """The prefix tree over the INPUTS of ``members`` (of one policy): each one's tokens but the
    last (the logits at positions first completion - 1 .. len - 2 score its completion), so an
    earlier chat turn, whose whole input starts the next turn's prompt, is scored from the later
    turn's rows and runs no rows of its own.

    The inputs are sorted (as big-endian bytes, which sort as the token ids do) and the tree is
    their LCP-interval tree, built top-down with an explicit stack: a run of sorted inputs that
    share ``depth`` tokens and whose neighbours share at least l > depth is a node [depth, l),
    split into sub-runs where the neighbours share exactly l (an input of length l ends at the
    node). A node is made only where it saves ``min_saved`` slots or more, ``(sub-runs - 1) *
    (l - depth)``; otherwise its sub-runs go on from ``depth`` under the same parent. An input
    alone in its run gets a tail from ``depth``. With ``min_saved`` 0 the tokens run are the
    trie's: every distinct prefix of the inputs once. ``min_saved`` None: ``MIN_SHARED_TOKENS``.
    """
    min_saved = MIN_SHARED_TOKENS if min_saved is None else min_saved
    off = b.member_offsets.tolist()
    ids = b.input_ids.cpu().numpy().astype(">i8")  # big-endian: the bytes sort as the token ids do
    scored = b.loss_mask.cpu().numpy()
    keys: list[tuple[bytes, int]] = []
    for m in members.tolist():
        s, e = off[m], off[m + 1]
        if scored[s + 1:e].any():  # no completion token: nothing to score, no path
            keys.append((ids[s:e - 1].tobytes(), m))
    keys.sort()
    tree = _PrefixTree()
    n = len(keys)
    if not n:
        return tree
    length = [len(k) // 8 for k, _ in keys]
    lcp = np.array([_common(keys[i][0], keys[i + 1][0]) for i in range(n - 1)], dtype=np.int64)  # of i, i + 1
    stack = [(0, n, 0, -1)]  # (run lo..hi of sorted inputs sharing ``depth`` tokens, the segment they continue)
    while stack:
        lo, hi, depth, parent = stack.pop()
        if hi - lo == 1:
            m = keys[lo][1]
            tree.last[m] = tree.add(depth, length[lo], m, parent) if length[lo] > depth else parent
            continue
        span = lcp[lo:hi - 1]
        ell = int(span.min())
        bounds = [lo, *(lo + 1 + np.flatnonzero(span == ell)).tolist(), hi]
        if ell > depth and (len(bounds) - 2) * (ell - depth) >= min_saved:
            parent, depth = tree.add(depth, ell, keys[lo][1], parent), ell
        stack.extend((x, y, depth, parent) for x, y in zip(bounds[-2::-1], bounds[:0:-1]))
    return tree


class _CannotRepeat(Exception):
    """A forward's KV cache is not one :func:`_repeat_cache` can repeat."""


def _prefix_forward(model: torch.nn.Module, b: SetBatch, policy: int, overhead: int) -> list[_Scored]:
    """The ``prefix`` layout (Note [Layouts]): the segments of the policy's prefix tree
    (:func:`_prefix_tree`), level by level. A level's segments are length-bucketed into
    right-padded forwards; a node's rows of its forward's KV cache are repeated to the segments
    that continue it, which attend to them through a 2-D mask hiding every padding cell above.
    Only the cells whose logits score a completion token are kept. A cache that cannot be
    repeated sends the policy's members the padded way, and so does a tree that runs more than
    ``MAX_TREE_SHARE`` of their tokens."""
    cache_kw = _cache_kwarg(model)
    assert cache_kw is not None  # choose_layout only picks prefix for a model that takes a cache
    members = (b.member_policy == policy).nonzero().squeeze(1)
    tree = _prefix_tree(b, members)
    if tree.num_tokens > MAX_TREE_SHARE * int((b.member_offsets[1:] - b.member_offsets[:-1])[members].sum()):
        return _padded_forward(model, b, policy, overhead)  # too little shared to pay for the cached levels
    try:
        return _run_tree(model, b, tree, overhead, cache_kw)
    except _CannotRepeat:
        return _padded_forward(model, b, policy, overhead)


def _run_tree(model: torch.nn.Module, b: SetBatch, tree: _PrefixTree, overhead: int, cache_kw: str) -> list[_Scored]:
    """The forwards of :func:`_prefix_forward`; raises :class:`_CannotRepeat`."""
    from srpo_graph.backends.transformers import cache_of

    num_seg = len(tree.start)
    if not num_seg:
        return []
    device = b.input_ids.device
    off = b.member_offsets.cpu().numpy()
    start, end = np.asarray(tree.start, dtype=np.int64), np.asarray(tree.end, dtype=np.int64)
    # 1. the cells: each completion token of a member with a path, the segment of that path that
    # runs the position before it (pairs (member, path segment) sorted by member then start, one search)
    ranked = np.asarray(sorted(tree.last), dtype=np.int64)  # members with a path
    paths = [tree.path(int(m)) for m in ranked]
    pair_seg = np.asarray([g for p in paths for g in p], dtype=np.int64)
    pair_rank = np.repeat(np.arange(len(ranked)), [len(p) for p in paths])
    big = int(end.max()) + 1
    comp = b.loss_mask.nonzero().squeeze(1).cpu().numpy()  # stream indices of completion tokens
    owner = np.searchsorted(off, comp, side="right") - 1  # their members
    rank = np.searchsorted(ranked, owner)
    mine = (rank < len(ranked)) & (ranked[np.minimum(rank, len(ranked) - 1)] == owner)
    where, rank, owner = comp[mine], rank[mine], owner[mine]
    p = where - off[owner] - 1  # [c] the position whose hidden state scores it
    pair = np.searchsorted(pair_rank * big + start[pair_seg], rank * big + p, side="right") - 1
    cell_seg = pair_seg[pair]  # [c]
    cell_col = p - start[cell_seg]  # [c] column in that segment's row
    needed = np.bincount(cell_seg, minlength=num_seg) > 0  # a cell to keep, or (below) a segment under it that has
    for g in range(num_seg - 1, -1, -1):  # children come after their parent
        if needed[g] and tree.parent[g] >= 0:
            needed[tree.parent[g]] = True
    order = np.argsort(cell_seg, kind="stable")  # the cells of segment g: order[first[g]:first[g + 1]]
    first = np.concatenate([[0], np.cumsum(np.bincount(cell_seg, minlength=num_seg))])
    where_t, owner_t = torch.as_tensor(where, device=device), torch.as_tensor(owner, device=device)

    # 2. the forwards: a stack of calls (parent cache, its [rows, P] bool mask, segments, their rows in it)
    out: list[_Scored] = []
    roots = [g for g in range(num_seg) if tree.parent[g] < 0 and needed[g]]
    stack: list[tuple[object, torch.Tensor | None, list[int], list[int]]] = [(None, None, roots, [])]
    while stack:
        cache, pmask, segs_all, prow_all = stack.pop()
        lens = (end[segs_all] - start[segs_all]).tolist()
        for bucket in length_buckets(lens, overhead):
            segs = np.asarray([segs_all[i] for i in bucket], dtype=np.int64)
            seg_start = torch.as_tensor(start[segs], device=device)
            n = torch.as_tensor(end[segs] - start[segs], device=device)  # [B]
            col = torch.arange(int(n.max()), device=device)  # [L]
            valid = col.unsqueeze(0) < n.unsqueeze(1)  # [B, L]: False on the right padding
            base = torch.as_tensor(off[np.asarray(tree.rep)[segs]], device=device) + seg_start
            grid = (base.unsqueeze(1) + col).masked_fill(~valid, 0)  # [B, L] stream index
            cells = np.concatenate([order[first[g]:first[g + 1]] for g in segs])  # this bucket's cells
            row_of = np.full(num_seg, -1, dtype=np.int64)
            row_of[segs] = np.arange(len(segs))
            flat = torch.as_tensor(row_of[cell_seg[cells]] * int(col.numel()) + cell_col[cells], device=device)
            keep = torch.zeros(valid.numel(), dtype=torch.bool, device=device)
            keep[flat] = True
            kept = (torch.cumsum(keep, 0) - 1).index_select(0, flat)  # each cell's row of the kept logits (row-major)
            has_kids = [any(needed[c] for c in tree.children[g]) for g in segs.tolist()]
            inputs: dict = {"input_ids": b.input_ids[grid].masked_fill(~valid, 0),  # pad: any id, hidden by the masks
                            "position_ids": seg_start.unsqueeze(1) + col, "use_cache": cache is not None or any(has_kids)}
            mask = valid
            if cache is not None:  # continue the parent rows: their cache, their mask, then this row
                rows = torch.as_tensor([prow_all[i] for i in bucket], device=device)
                mask = torch.cat([pmask.index_select(0, rows), valid], dim=1)  # type: ignore[union-attr]
                inputs.update({"attention_mask": mask.long(), cache_kw: _repeat_cache(cache, rows)})
            logits, fwd = _logits_at(model, keep.view_as(valid), **inputs)
            if cells.size:
                sel = torch.as_tensor(cells, device=device)
                # several members may read one cell (a shared node): index_select sums their gradients
                out.append((logits.index_select(0, kept), where_t.index_select(0, sel), owner_t.index_select(0, sel)))
            if any(has_kids):
                new_cache = cache_of(fwd)
                if not _can_repeat(new_cache):
                    raise _CannotRepeat
                kids = [(c, r) for r, g in enumerate(segs.tolist()) for c in tree.children[g] if needed[c]]
                stack.append((new_cache, mask, [c for c, _ in kids], [r for _, r in kids]))
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
