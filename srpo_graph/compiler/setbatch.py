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
        lengths = self.member_offsets[1:] - self.member_offsets[:-1]
        return torch.repeat_interleave(torch.arange(self.num_members), lengths)

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
        }

    def with_(self, **changes: Any) -> "SetBatch":
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
            raise CompileError(f"{path}: error: not a readable safetensors file: {exc}") from None
        if "srpo_graph" not in meta:
            raise CompileError(f"{path}: error: safetensors file has no srpo-graph header")
        header = json.loads(meta["srpo_graph"])
        if header.get("format") != FORMAT:
            raise CompileError(f"{path}: error: format {header.get('format')!r} is not {FORMAT!r}")
        names = {f.name for f in fields(cls)}
        missing = sorted(n for n in names if n not in tensors and n not in header and n != "stats")
        if missing:
            raise CompileError(f"{path}: error: missing tensors {missing}")
        header.pop("format")
        return cls(**tensors, **header)
