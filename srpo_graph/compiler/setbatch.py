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
_OPTIONAL = {"stats", "member_agent", "set_episode_events", "agents", "member_ids", "set_ids", "micro_batch_tokens"}


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
        0 = one micro-batch).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    member_offsets: torch.Tensor
    member_set: torch.Tensor
    member_policy: torch.Tensor
    member_policy_version: torch.Tensor
    member_index: torch.Tensor
    member_temperature: torch.Tensor
    member_allowed: torch.Tensor
    set_size: torch.Tensor
    set_expected_size: torch.Tensor
    set_advantage: torch.Tensor
    set_reward: torch.Tensor
    set_episode: torch.Tensor
    set_transition: torch.Tensor
    set_group: torch.Tensor
    set_prestate: torch.Tensor
    micro_batch: torch.Tensor
    episode_reward: torch.Tensor
    episode_group: torch.Tensor
    allowed_ids: torch.Tensor
    allowed_offsets: torch.Tensor
    policies: list[str] = field(default_factory=list)
    transitions: list[str] = field(default_factory=list)
    episode_ids: list[str] = field(default_factory=list)
    group_ids: list[str] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    workflow: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    member_agent: torch.Tensor | None = None
    set_episode_events: torch.Tensor | None = None
    agents: list[str] = field(default_factory=list)
    member_ids: list[str] = field(default_factory=list)
    set_ids: list[str] = field(default_factory=list)
    micro_batch_tokens: int = 0

    def __post_init__(self) -> None:
        if self.member_agent is None:
            self.member_agent = torch.zeros(self.member_set.numel(), dtype=torch.int64)
        if self.set_episode_events is None:
            self.set_episode_events = _episode_counts(self.set_episode)

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
        return {
            "format": FORMAT,
            "policies": self.policies,
            "transitions": self.transitions,
            "episode_ids": self.episode_ids,
            "group_ids": self.group_ids,
            "task_ids": self.task_ids,
            "workflow": self.workflow,
            "stats": self.stats,
            "agents": self.agents,
            "member_ids": self.member_ids,
            "set_ids": self.set_ids,
            "micro_batch_tokens": self.micro_batch_tokens,
        }

    def with_(self, **changes: Any) -> "SetBatch":
        return replace(self, **changes)

    def to(self, device: torch.device | str) -> "SetBatch":
        """The same batch with every tensor on ``device`` (a no-op when already there)."""
        device = torch.device(device)
        if self.input_ids.device == device:
            return self
        return replace(self, **{k: v.to(device) for k, v in self.tensors().items()})

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

        def t(x: torch.Tensor) -> torch.Tensor:
            return x[tok]

        def m(x: torch.Tensor) -> torch.Tensor:
            return x[members]

        def s(x: torch.Tensor) -> torch.Tensor:
            return x[sets]

        set_episode = s(self.set_episode)
        if keep_micro_batch:
            old_mb = s(self.micro_batch)
            micro_batch = old_mb - old_mb.min() if old_mb.numel() else old_mb
        else:
            set_tok = torch.zeros(sets.numel(), dtype=torch.int64, device=dev).index_add_(
                0, mem_new_set[members], lengths)
            micro_batch = torch.tensor(assign_micro_batches(set_tok.tolist(), self.micro_batch_tokens),
                                       dtype=torch.int64, device=dev)
        ml = members.tolist()
        sl = sets.tolist()
        return replace(
            self,
            input_ids=t(self.input_ids), position_ids=t(self.position_ids), loss_mask=t(self.loss_mask),
            sampler_logprobs=t(self.sampler_logprobs), old_logprobs=t(self.old_logprobs),
            member_offsets=new_offsets, member_set=mem_new_set[members],
            member_policy=m(self.member_policy), member_policy_version=m(self.member_policy_version),
            member_index=m(self.member_index), member_temperature=m(self.member_temperature),
            member_allowed=m(self.member_allowed), member_agent=m(self.member_agent),
            set_size=s(self.set_size), set_expected_size=s(self.set_expected_size),
            set_advantage=s(self.set_advantage), set_reward=s(self.set_reward), set_episode=set_episode,
            set_transition=s(self.set_transition), set_group=s(self.set_group),
            set_prestate=s(self.set_prestate), micro_batch=micro_batch,
            set_episode_events=_episode_counts(set_episode) if recount else s(self.set_episode_events),
            member_ids=[self.member_ids[i] for i in ml] if self.member_ids else [],
            set_ids=[self.set_ids[i] for i in sl] if self.set_ids else [],
        )

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
            raise CompileError(f"{path}: error: not a readable safetensors file: {exc}") from None
        if "srpo_graph" not in meta:
            raise CompileError(f"{path}: error: safetensors file has no srpo-graph header")
        header = json.loads(meta["srpo_graph"])
        if header.get("format") != FORMAT:
            raise CompileError(f"{path}: error: format {header.get('format')!r} is not {FORMAT!r}")
        names = {f.name for f in fields(cls)}
        missing = sorted(n for n in names - _OPTIONAL if n not in tensors and n not in header)
        if missing:
            raise CompileError(f"{path}: error: missing tensors {missing}")
        header.pop("format")
        return cls(**tensors, **header)
