"""``SetBatch``: the active-set tensors (compiler -> loss), and their safetensors file format.

Packed, no padding: every member (one agent output, prompt + completion) is one contiguous
segment of the token stream; positions restart at 0 for each member. Members of one set
(event) are adjacent, and micro-batches are contiguous ranges of whole sets, so a set is
never split. T = tokens, M = members, S = sets (events), E = episodes.

Saved as a ``.safetensors`` file whose metadata holds a small JSON header (names of
policies and transitions, episode ids, counters). Never pickle.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from srpo_graph.errors import CompileError

FORMAT = "srpo-graph.setbatch/1"
EPISODE_STATUS = {"ok": 0, "truncated": 1, "failed": 2}  # episode_status codes


@dataclass
class CompileStats:
    """What the compiler counted (the typed hand-off of ``SetBatch.stats``; saved in the header).

    Episodes: all, failed (dropped or zeroed), truncated (dropped or penalized). Events: kept,
    dropped incomplete (a missing or aborted member), empty (consumed nothing), in zero-variance
    or singleton groups, dropped for zero variance. Sizes: members, tokens, completion tokens.
    ``skipped_bad_lines``: trace lines the CLI skipped (``--skip-bad``).
    """

    episodes: int = 0
    failed_episodes: int = 0
    dropped_failed_episodes: int = 0
    zeroed_failed_episodes: int = 0
    truncated_episodes: int = 0
    dropped_truncated_episodes: int = 0
    penalized_truncated_episodes: int = 0
    dropped_incomplete_events: int = 0
    empty_events: int = 0
    advantage_groups: int = 0
    zero_variance_groups: int = 0
    singleton_groups: int = 0
    zero_variance_events: int = 0
    singleton_events: int = 0
    dropped_zero_variance_events: int = 0
    frozen_only_events: int = 0  # firings whose every member is a frozen policy's: not events
    frozen_members: int = 0  # members of kept events sampled from frozen policies (not packed)
    events: int = 0
    members: int = 0
    tokens: int = 0
    completion_tokens: int = 0
    skipped_bad_lines: int = 0

    def to_dict(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CompileStats":
        """From a header (keys it does not know, e.g. from a newer writer, are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in known})


def _dim(dim: str, dtype: torch.dtype, optional: bool = False) -> Any:
    """A tensor field, its leading dimension (T tokens, M members, S sets, E episodes, A allowed
    rows) and dtype. ``_take`` (selection), ``load`` and ``from_columns`` (the compiler) read it,
    so a new field is declared once, here."""
    meta = {"dim": dim, "dtype": dtype, "optional": optional}
    return field(default=None, metadata=meta) if optional else field(metadata=meta)


def _dims() -> dict[str, str]:
    return {f.name: f.metadata["dim"] for f in fields(SetBatch) if "dim" in f.metadata}


def _episode_counts(set_episode: torch.Tensor) -> torch.Tensor:
    """[S] -> [S]: how many sets share each set's episode."""
    if set_episode.numel() == 0:
        return torch.zeros(0, dtype=torch.int64)
    counts = torch.bincount(set_episode)
    return counts[set_episode]


def assign_micro_batches(set_tokens: list[int], budget: int) -> list[int]:
    """Fill micro-batches greedily, in set order, up to ``budget`` tokens; never split a set.

    A set larger than the budget gets a micro-batch of its own. ``budget <= 0``: one micro-batch.

    >>> assign_micro_batches([3, 3, 3, 10, 1], budget=6)
    [0, 0, 1, 2, 3]
    """
    out: list[int] = []
    mb, used = 0, 0
    for n in set_tokens:
        if budget > 0 and used > 0 and used + n > budget:
            mb, used = mb + 1, 0
        out.append(mb)
        used += n
    return out


@dataclass
class SetBatch:
    """Active-set tensors. Shapes and dtypes:

    Token stream [T]:
        input_ids (int64), position_ids (int64; restart at 0 per member),
        loss_mask (bool; True on completion tokens),
        sampler_logprobs (float32; the engine's log-probs on completion tokens, 0 elsewhere),
        old_logprobs (float32; pi_old on completion tokens: the sampler's until the trainer
        recomputes them before the first update).
    Members [M] (+1 for offsets):
        member_offsets [M+1] (int64), member_set (int64), member_policy (int64; index into
        ``policies``), member_policy_version (int64), member_index (int64; position within its
        set), member_temperature (float32), member_allowed (int64; index into the allowed-token
        table, -1 = unconstrained).
    Sets [S]:
        set_size (int64; members present), set_expected_size (int64; members the transition
        consumed), set_advantage (float32), set_reward (float32; the return the advantage was
        computed from), set_episode (int64; index into ``episode_ids``), set_transition (int64;
        index into ``transitions``), set_group (int64; advantage group), set_prestate (int64;
        shared pre-state id: one per (episode, step)), micro_batch (int64; non-decreasing).
    Episodes [E]:
        episode_reward (float32), episode_group (int64; index into ``group_ids``).
    Allowed-token table (ragged):
        allowed_ids [A_total] (int64), allowed_offsets [A+1] (int64).
    Header:
        policies, transitions, episode_ids, group_ids, task_ids (per group), workflow,
        stats (counters such as dropped incomplete events).
    Extensions (optional when constructing; filled in ``__post_init__`` when absent):
        member_agent [M] (int64; index into ``agents``), set_episode_events [S] (int64; how
        many sets of this set's episode the *mini-batch* holds: recounted by
        :meth:`select_sets`, kept by :meth:`micro_batches`, used by the per-episode loss
        reduction), header ``agents``, ``member_ids`` (output ids), ``set_ids`` (transition
        record ids) and ``micro_batch_tokens`` (the token budget micro-batches are filled to;
        0 = one micro-batch); member_advantage [M] (float32; each member's advantage: its set's,
        except in the per-member Dr. MAS mode), member_max_tokens [M] (int64; the max_new_tokens
        each member was sampled with, Dr. GRPO's constant denominator), episode_status [E]
        (int8; ``EPISODE_STATUS``: 0 ok, 1 truncated, 2 failed and scored 0); member_top_k
        (int64), member_top_p (float32) [M]: the top-k / top-p the trainer re-applies to recompute
        a member recorded under the ``sampled`` log-prob convention (0 / 1 = none);
        set_frozen_size [S] (int64; members of the set sampled from frozen or external policies:
        part of the action, not packed, no log-ratio; ``set_size`` counts the packed ones).
    """

    input_ids: torch.Tensor = _dim("T", torch.int64)
    position_ids: torch.Tensor = _dim("T", torch.int64)
    loss_mask: torch.Tensor = _dim("T", torch.bool)
    sampler_logprobs: torch.Tensor = _dim("T", torch.float32)
    old_logprobs: torch.Tensor = _dim("T", torch.float32)
    member_offsets: torch.Tensor = _dim("M+1", torch.int64)
    member_set: torch.Tensor = _dim("M", torch.int64)
    member_policy: torch.Tensor = _dim("M", torch.int64)
    member_policy_version: torch.Tensor = _dim("M", torch.int64)
    member_index: torch.Tensor = _dim("M", torch.int64)
    member_temperature: torch.Tensor = _dim("M", torch.float32)
    member_allowed: torch.Tensor = _dim("M", torch.int64)
    set_size: torch.Tensor = _dim("S", torch.int64)
    set_expected_size: torch.Tensor = _dim("S", torch.int64)
    set_advantage: torch.Tensor = _dim("S", torch.float32)
    set_reward: torch.Tensor = _dim("S", torch.float32)
    set_episode: torch.Tensor = _dim("S", torch.int64)
    set_transition: torch.Tensor = _dim("S", torch.int64)
    set_group: torch.Tensor = _dim("S", torch.int64)
    set_prestate: torch.Tensor = _dim("S", torch.int64)
    micro_batch: torch.Tensor = _dim("S", torch.int64)
    episode_reward: torch.Tensor = _dim("E", torch.float32)
    episode_group: torch.Tensor = _dim("E", torch.int64)
    allowed_ids: torch.Tensor = _dim("A", torch.int64)
    allowed_offsets: torch.Tensor = _dim("A", torch.int64)
    policies: list[str] = field(default_factory=list)
    transitions: list[str] = field(default_factory=list)
    episode_ids: list[str] = field(default_factory=list)
    group_ids: list[str] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    workflow: str = ""
    stats: CompileStats = field(default_factory=CompileStats)
    # the extensions: None (omitted) when constructing, always a tensor once built (``__post_init__``)
    member_agent: torch.Tensor = _dim("M", torch.int64, optional=True)
    set_episode_events: torch.Tensor = _dim("S", torch.int64, optional=True)
    member_advantage: torch.Tensor = _dim("M", torch.float32, optional=True)
    member_max_tokens: torch.Tensor = _dim("M", torch.int64, optional=True)
    member_top_k: torch.Tensor = _dim("M", torch.int64, optional=True)
    member_top_p: torch.Tensor = _dim("M", torch.float32, optional=True)
    episode_status: torch.Tensor = _dim("E", torch.int8, optional=True)
    set_frozen_size: torch.Tensor = _dim("S", torch.int64, optional=True)
    agents: list[str] = field(default_factory=list)
    member_ids: list[str] = field(default_factory=list)
    set_ids: list[str] = field(default_factory=list)
    micro_batch_tokens: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stats, dict):  # a plain mapping (hand-built batches): typed here
            self.stats = CompileStats.from_dict(self.stats)
        if self.member_agent is None:
            self.member_agent = torch.zeros(self.member_set.numel(), dtype=torch.int64)
        if self.set_episode_events is None:
            self.set_episode_events = _episode_counts(self.set_episode)
        if self.member_advantage is None:  # one advantage per set: every member carries it
            self.member_advantage = self.set_advantage.index_select(0, self.member_set)
        if self.member_max_tokens is None:  # unknown: the member's own completion length
            self.member_max_tokens = self.member_completion_tokens
        if self.member_top_k is None:  # no filter to re-apply (the "full" log-prob convention)
            self.member_top_k = torch.zeros(self.member_set.numel(), dtype=torch.int64)
        if self.member_top_p is None:
            self.member_top_p = torch.ones(self.member_set.numel(), dtype=torch.float32)
        if self.episode_status is None:
            self.episode_status = torch.zeros(self.episode_reward.numel(), dtype=torch.int8)
        if self.set_frozen_size is None:  # no frozen policy: every member of a set is packed
            self.set_frozen_size = torch.zeros(self.set_size.numel(), dtype=torch.int64)

    @property
    def member_completion_tokens(self) -> torch.Tensor:
        """[M] int64: completion tokens of each member."""
        prefix = torch.zeros(self.num_tokens + 1, dtype=torch.int64, device=self.loss_mask.device)
        torch.cumsum(self.loss_mask.long(), 0, out=prefix[1:])
        at = prefix.index_select(0, self.member_offsets)
        return at[1:] - at[:-1]

    @property
    def set_truncated(self) -> torch.Tensor:
        """[S] bool: the set's episode was truncated."""
        return self.episode_status.index_select(0, self.set_episode) == EPISODE_STATUS["truncated"]

    # -- sizes and derived views --------------------------------------------------

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def num_members(self) -> int:
        return int(self.member_set.numel())

    @property
    def num_sets(self) -> int:
        return int(self.set_size.numel())

    @property
    def num_micro_batches(self) -> int:
        return int(self.micro_batch.max().item()) + 1 if self.num_sets else 0

    @property
    def token_member(self) -> torch.Tensor:
        """[T] int64: the member each token belongs to (segment ids)."""
        # a cumulative sum of member-start markers: faster than repeat_interleave on CPU
        marks = torch.zeros(self.num_tokens, dtype=torch.int64, device=self.member_offsets.device)
        starts = self.member_offsets[1:-1]
        marks.index_add_(0, starts[starts < self.num_tokens], torch.ones_like(starts[starts < self.num_tokens]))
        return torch.cumsum(marks, 0)

    def allowed(self, index: int) -> torch.Tensor:
        """The allowed token ids of table row ``index``."""
        return self.allowed_ids[self.allowed_offsets[index] : self.allowed_offsets[index + 1]]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}

    def header(self) -> dict[str, Any]:
        """The JSON header: every field that is not a tensor (names, ids, counters), by declaration."""
        out: dict[str, Any] = {"format": FORMAT}
        for f in fields(self):
            if "dim" not in f.metadata:
                value = getattr(self, f.name)
                out[f.name] = value.to_dict() if isinstance(value, CompileStats) else value
        return out

    @classmethod
    def from_columns(cls, columns: dict[str, Any], **rest: Any) -> "SetBatch":
        """A batch from plain columns (lists or arrays, one per tensor field, named as the
        fields) and the header fields; each column becomes a tensor of its declared dtype.

        Raises:
            TypeError: a column names no tensor field (or a required one is missing).
        """
        import numpy as np

        meta = {f.name: f.metadata for f in fields(cls) if "dim" in f.metadata}
        unknown = sorted(set(columns) - set(meta))
        if unknown:
            raise TypeError(f"SetBatch has no tensor fields {unknown}")
        tensors: dict[str, Any] = {}
        for name, col in columns.items():
            if torch.is_tensor(col):
                tensors[name] = col.to(meta[name]["dtype"])
            else:
                np_dtype = np.dtype(str(meta[name]["dtype"]).removeprefix("torch."))
                tensors[name] = torch.as_tensor(np.asarray(col, dtype=np_dtype))
        return cls(**tensors, **rest)

    def with_(self, **changes: Any) -> "SetBatch":
        """A copy with ``changes``; new set advantages without member ones are given to every member."""
        if "set_advantage" in changes and "member_advantage" not in changes:
            changes["member_advantage"] = changes["set_advantage"].index_select(0, self.member_set)
        return replace(self, **changes)

    def to(self, device: torch.device | str) -> "SetBatch":
        """The same batch with every tensor on ``device`` (a no-op when already there)."""
        device = torch.device(device)
        if self.input_ids.device == device:
            return self
        moved: dict[str, Any] = {k: v.to(device) for k, v in self.tensors().items()}
        return replace(self, **moved)

    # -- selection: whole sets only ---------------------------------------------------

    @property
    def set_tokens(self) -> torch.Tensor:
        """[S] int64: tokens (prompt + completion) of each set."""
        lengths = self.member_offsets[1:] - self.member_offsets[:-1]
        out = torch.zeros(self.num_sets, dtype=torch.int64, device=lengths.device)
        return out.index_add_(0, self.member_set, lengths)

    def select_sets(self, indices: Any) -> "SetBatch":
        """A new batch holding the sets ``indices`` (in that order), whole and re-indexed.

        Members and tokens follow their sets, so the result is contiguous; micro-batches are
        re-filled to ``micro_batch_tokens`` in the new order, and ``set_episode_events``
        is recounted over the selection (a selection is a mini-batch). Episode-level rows
        and the header lists are kept whole, so ``set_episode`` etc. still index them.

        Args:
            indices: set indices (list, range or 1-D int tensor); any order, no repeats needed.
        Returns:
            SetBatch.
        """
        return self._take(torch.as_tensor(list(indices) if not torch.is_tensor(indices) else indices,
                                           dtype=torch.int64), recount=True, keep_micro_batch=False)

    def micro_batches(self) -> list["SetBatch"]:
        """Split into the micro-batches recorded in ``micro_batch`` (whole sets each).

        Unlike :meth:`select_sets`, ``set_episode_events`` keeps the counts of this
        (mini-)batch, so per-episode weights do not change with the split.
        """
        if self.num_sets == 0:
            return []
        mb = self.micro_batch.cpu()
        bounds = torch.searchsorted(mb, torch.arange(int(mb.max()) + 2), right=False).tolist()
        return [
            self._take(torch.arange(bounds[i], bounds[i + 1]), recount=False, keep_micro_batch=True)
            for i in range(len(bounds) - 1)
            if bounds[i + 1] > bounds[i]
        ]

    def with_micro_batch_tokens(self, budget: int) -> "SetBatch":
        """The same sets, micro-batches re-filled (in set order) to ``budget`` tokens (0 = one)."""
        mb = assign_micro_batches(self.set_tokens.tolist(), budget)
        return replace(self, micro_batch=torch.tensor(mb, dtype=torch.int64), micro_batch_tokens=budget)

    def _take(self, sets: torch.Tensor, *, recount: bool, keep_micro_batch: bool) -> "SetBatch":
        dev = self.input_ids.device
        sets = sets.to(dev)
        # members of the chosen sets, grouped by set in the chosen order (members of a set
        # are adjacent and in member_index order in the source, so a stable sort keeps them)
        new_set_of_old = torch.full((self.num_sets,), -1, dtype=torch.int64, device=dev)
        new_set_of_old[sets] = torch.arange(sets.numel(), device=dev)
        mem_new_set = new_set_of_old[self.member_set]
        keep = (mem_new_set >= 0).nonzero().squeeze(1)
        order = torch.sort(mem_new_set[keep], stable=True).indices
        members = keep[order]
        # tokens of those members, in member order
        starts = self.member_offsets[:-1][members]
        lengths = (self.member_offsets[1:] - self.member_offsets[:-1])[members]
        new_offsets = torch.zeros(members.numel() + 1, dtype=torch.int64, device=dev)
        new_offsets[1:] = torch.cumsum(lengths, 0)
        seg = torch.repeat_interleave(torch.arange(members.numel(), device=dev), lengths)
        tok = starts[seg] + (torch.arange(int(new_offsets[-1]), device=dev) - new_offsets[:-1][seg])

        set_episode = self.set_episode[sets]
        if keep_micro_batch:
            old_mb = self.micro_batch[sets]
            micro_batch = old_mb - old_mb.min() if old_mb.numel() else old_mb
        else:
            set_tok = torch.zeros(sets.numel(), dtype=torch.int64, device=dev).index_add_(
                0, mem_new_set[members], lengths)
            micro_batch = torch.tensor(assign_micro_batches(set_tok.tolist(), self.micro_batch_tokens),
                                       dtype=torch.int64, device=dev)
        # every field by its declared dimension (``_dim``): tokens, members and sets follow the
        # selection, episode- and table-level rows are kept whole (the indices still point there)
        index = {"T": tok, "M": members, "S": sets}
        changes: dict[str, Any] = {name: getattr(self, name)[index[dim]] for name, dim in _dims().items()
                                   if dim in index and getattr(self, name) is not None}
        changes.update(
            member_offsets=new_offsets, member_set=mem_new_set[members], set_episode=set_episode,
            micro_batch=micro_batch,
            set_episode_events=_episode_counts(set_episode) if recount else self.set_episode_events[sets],
            member_ids=[self.member_ids[i] for i in members.tolist()] if self.member_ids else [],
            set_ids=[self.set_ids[i] for i in sets.tolist()] if self.set_ids else [],
        )
        return replace(self, **changes)

    # -- file format ------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write ``path`` (safetensors; the header as JSON metadata), atomically."""
        tmp = f"{os.fspath(path)}.tmp"
        tensors = {k: v.contiguous() for k, v in self.tensors().items()}
        save_file(tensors, tmp, metadata={"srpo_graph": json.dumps(self.header())})
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SetBatch":
        """Read a file written by :meth:`save`; :class:`CompileError` if it is not one."""
        try:
            with safe_open(os.fspath(path), framework="pt") as fh:
                meta = fh.metadata() or {}
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        except Exception as exc:  # safetensors raises its own error types
            raise CompileError.at(str(path), f"not a readable safetensors file: {exc}") from None
        if "srpo_graph" not in meta:
            raise CompileError.at(str(path), "safetensors file has no srpo-graph header")
        header = json.loads(meta["srpo_graph"])
        if header.get("format") != FORMAT:
            raise CompileError.at(str(path), f"format {header.get('format')!r} is not {FORMAT!r}")
        required = {f.name for f in fields(cls) if "dim" in f.metadata and not f.metadata["optional"]}
        missing = sorted(n for n in required if n not in tensors)
        if missing:
            raise CompileError.at(str(path), f"missing tensors {missing}")
        header.pop("format")
        header["stats"] = CompileStats.from_dict(header.get("stats") or {})
        return cls(**tensors, **header)
