"""The ``prefix`` layout (logprobs.py, Note [Layouts]): the prefix tree over one policy's member
inputs, and its forwards level by level through repeated KV caches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from srpo_graph.compiler.setbatch import SetBatch
from srpo_graph.srpo.forwards import Scored, cache_kwarg, length_buckets, logits_at, padded_forward

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
class PrefixTree:
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


def prefix_tree(b: SetBatch, members: torch.Tensor, min_saved: int | None = None) -> PrefixTree:
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
    tree = PrefixTree()
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


def prefix_forward(model: torch.nn.Module, b: SetBatch, policy: int, overhead: int) -> list[Scored]:
    """The ``prefix`` layout (Note [Layouts]): the segments of the policy's prefix tree
    (:func:`prefix_tree`), level by level. A level's segments are length-bucketed into
    right-padded forwards; a node's rows of its forward's KV cache are repeated to the segments
    that continue it, which attend to them through a 2-D mask hiding every padding cell above.
    Only the cells whose logits score a completion token are kept. A cache that cannot be
    repeated sends the policy's members the padded way, and so does a tree that runs more than
    ``MAX_TREE_SHARE`` of their tokens."""
    cache_kw = cache_kwarg(model)
    assert cache_kw is not None  # choose_layout only picks prefix for a model that takes a cache
    members = (b.member_policy == policy).nonzero().squeeze(1)
    tree = prefix_tree(b, members)
    if tree.num_tokens > MAX_TREE_SHARE * int((b.member_offsets[1:] - b.member_offsets[:-1])[members].sum()):
        return padded_forward(model, b, policy, overhead)  # too little shared to pay for the cached levels
    try:
        return _run_tree(model, b, tree, overhead, cache_kw)
    except _CannotRepeat:
        return padded_forward(model, b, policy, overhead)


def _run_tree(model: torch.nn.Module, b: SetBatch, tree: PrefixTree, overhead: int, cache_kw: str) -> list[Scored]:
    """The forwards of :func:`prefix_forward`; raises :class:`_CannotRepeat`."""
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
    out: list[Scored] = []
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
                            "position_ids": seg_start.unsqueeze(1) + col,
                            "use_cache": cache is not None or any(has_kids)}
            mask = valid
            if cache is not None:  # continue the parent rows: their cache, their mask, then this row
                rows = torch.as_tensor([prow_all[i] for i in bucket], device=device)
                mask = torch.cat([pmask.index_select(0, rows), valid], dim=1)  # type: ignore[union-attr]
                inputs.update({"attention_mask": mask.long(), cache_kw: _repeat_cache(cache, rows)})
            logits, fwd = logits_at(model, keep.view_as(valid), **inputs)
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
    return (
        type(cache) is DynamicCache
        and bool(layers)
        and all(type(layer) is DynamicLayer and layer.keys is not None for layer in layers)
    )


def _repeat_cache(cache, rows: torch.Tensor):
    """A new KV cache whose row r is ``cache``'s row ``rows[r]`` (a gather: gradients flow back to
    ``cache``, which is left as it was). Only for a cache that :func:`_can_repeat`."""
    return type(cache)(
        ddp_cache_data=[
            (layer.keys.index_select(0, rows), layer.values.index_select(0, rows)) for layer in cache.layers
        ]
    )
