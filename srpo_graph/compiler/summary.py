"""A readable summary of a :class:`SetBatch` (compiler stage; used by ``srpo-graph inspect``).

Consumes a SetBatch; produces a :class:`BatchSummary` (plain numbers, JSON-able). Also
computes what the same members would cost as a padded batch the way TRL builds one
(prompts left-padded and completions right-padded to the longest in the batch), which is
what the packed layout saves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from srpo_graph.compiler.setbatch import SetBatch


def padded_slots(batch: SetBatch) -> int:
    """Slots of a TRL-style padded batch of the same members: M x (max prompt + max completion)."""
    if batch.num_members == 0:
        return 0
    lengths = batch.member_offsets[1:] - batch.member_offsets[:-1]
    completion = torch.zeros(batch.num_members, dtype=torch.int64).index_add_(
        0, batch.token_member, batch.loss_mask.long()
    )
    prompt = lengths - completion
    return int(batch.num_members * (int(prompt.max()) + int(completion.max())))


@dataclass
class BatchSummary:
    events: int
    members: int
    episodes: int
    tokens: int
    completion_tokens: int
    micro_batches: int
    padded_slots: int  # a TRL-style padded batch of the same members
    real_token_share_padded: float  # tokens / padded_slots (packed: 1.0)
    set_size_histogram: dict[int, int]
    advantage_mean: float
    advantage_std: float
    advantage_min: float
    advantage_max: float
    advantage_zero_share: float
    policies: list[str] = field(default_factory=list)
    transitions: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)  # CompileStats.to_dict(), for JSON

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(batch: SetBatch) -> BatchSummary:
    """Summarize ``batch``.

    Args:
        batch: a SetBatch.
    Returns:
        BatchSummary.
    """
    adv = batch.set_advantage.double()
    sizes, counts = torch.unique(batch.set_size, return_counts=True)
    padded = padded_slots(batch)
    n = adv.numel()
    return BatchSummary(
        events=batch.num_sets,
        members=batch.num_members,
        episodes=int(torch.unique(batch.set_episode).numel()),
        tokens=batch.num_tokens,
        completion_tokens=int(batch.loss_mask.sum()),
        micro_batches=batch.num_micro_batches,
        padded_slots=padded,
        real_token_share_padded=batch.num_tokens / padded if padded else 1.0,
        set_size_histogram={int(k): int(v) for k, v in zip(sizes.tolist(), counts.tolist())},
        advantage_mean=float(adv.mean()) if n else 0.0,
        advantage_std=float(adv.std()) if n > 1 else 0.0,
        advantage_min=float(adv.min()) if n else 0.0,
        advantage_max=float(adv.max()) if n else 0.0,
        advantage_zero_share=float((adv == 0).double().mean()) if n else 0.0,
        policies=list(batch.policies),
        transitions=list(batch.transitions),
        stats=batch.stats.to_dict(),
    )
