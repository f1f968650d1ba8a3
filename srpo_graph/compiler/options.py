"""The compiler's options: :class:`CompileConfig` and its enums (compiler stage, no torch).

Kept apart from ``compile.py`` so the CLI and the config loader can list choices without
importing torch. Every rule named here is defined in ``compile.py`` (returns, episode
treatment) or ``advantages.py`` (grouping, normalization) and stated in docs/algorithm.md.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class AdvantageMode(str, Enum):
    """What is normalized and over which group (``advantages.py``)."""

    TRANSITION = "transition"  # SRPO: one advantage per event; group (task group, transition)
    EPISODE = "episode"  # the episode return over the G episodes of a task; broadcast to its events
    AGENT = "agent"  # Dr. MAS: one advantage per MEMBER; group (task group, agent)


class ReturnMode(str, Enum):
    """The return R_e an event is credited with (``compile.py``)."""

    PROVENANCE = "provenance"  # own reward + rewards of causal descendants + terminal reward
    EPISODE = "episode"  # the episode's total reward for every event


class Grouping(str, Enum):
    """How repeated firings (loops) and partly reached events (routes) are grouped."""

    POOLED = "pooled"  # every firing of a transition (or output of an agent) in one group
    TURN = "turn"  # grouped by (transition or agent, turn index): the k-th firing with the k-th


class SingletonBaseline(str, Enum):
    """The advantage of an event alone in its group (e.g. a route only one rollout took)."""

    ZERO = "zero"  # advantage 0 (counted)
    EPISODE = "episode"  # its episode's advantage over the G episodes (the episode-level group)


class TruncatedPolicy(str, Enum):
    KEEP = "keep"  # events of truncated episodes are kept as they are
    DROP = "drop"  # the whole episode is left out (counted)
    PENALIZE = "penalize"  # kept, with truncated_penalty subtracted from the terminal reward


class FailedPolicy(str, Enum):
    DROP = "drop"  # the whole episode is left out (counted)
    ZERO = "zero"  # scored as a reward of 0 in its groups: its complete events get return 0


class CompileConfig(BaseModel):
    """How traces become a SetBatch. Defaults follow the SRPO paper where it says."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    advantage: AdvantageMode = Field(AdvantageMode.TRANSITION, description=(
        "Grouping of the advantage: 'transition' (same task group and transition across the G "
        "episodes; SRPO), 'episode' (episode return over the G episodes), 'agent' (Dr. MAS: one "
        "advantage per member, normalized over the same agent's outputs of the task group)."))
    returns: ReturnMode = Field(ReturnMode.PROVENANCE, description=(
        "The return R_e of an event: 'provenance' = its own reward + the rewards of the events that "
        "causally follow it (transitions consuming outputs of agents it activated, and so on) + the "
        "terminal reward; 'episode' = the episode's total reward for every event."))
    gamma: float = Field(1.0, ge=0.0, le=1.0, description=(
        "Discount per provenance hop, [0, 1]: a descendant d hops away counts gamma^d; the terminal "
        "reward counts gamma^h, h = hops to the event's deepest descendant. 1 = no discount."))
    grouping: Grouping = Field(Grouping.POOLED, description=(
        "'pooled': all firings of a transition (agent mode: all outputs of an agent) of a task group "
        "form one group; 'turn': grouped by (transition, k-th firing in its episode), as AT-GRPO."))
    singleton_baseline: SingletonBaseline = Field(SingletonBaseline.ZERO, description=(
        "Advantage of an event alone in its group (a route one rollout took, a late loop turn): "
        "'zero', or 'episode' = its episode's advantage over the G episodes. Counted either way."))
    use_std: bool = Field(True, description="Divide by the group std (GRPO/SRPO); False = Dr. GRPO.")
    std_unbiased: bool = Field(True, description="Sample std (n-1), as TRL and verl; False = population std.")
    eps: float = Field(1e-6, ge=0.0, le=1.0, description="Added to the group std; unitless, >= 0.")
    drop_zero_variance: bool = Field(False, description=(
        "Drop events whose group has zero variance (their advantage is 0 anyway); counted in stats."))
    micro_batch_tokens: int = Field(8192, ge=0, description=(
        "Token budget (prompt + completion tokens) of a micro-batch; 0 = one micro-batch. A set "
        "larger than the budget gets a micro-batch of its own."))
    missing_member: Literal["drop", "error"] = Field("drop", description=(
        "An event whose consumed output is missing or aborted: 'drop' it whole (counted) or raise."))
    truncated: TruncatedPolicy = Field(TruncatedPolicy.KEEP, description=(
        "Episodes that hit max_steps / max_rounds: 'keep', 'drop' (counted), or 'penalize' "
        "(truncated_penalty subtracted from their terminal reward). Marked in the batch either way."))
    truncated_penalty: float = Field(
        1.0, ge=0.0, le=1e6, description="Subtracted from a truncated episode's reward with truncated='penalize'."
    )
    failed: FailedPolicy = Field(
        FailedPolicy.DROP,
        description=(
            "Episodes that failed (a tool or reward raised, a backend error): 'drop' (counted) or 'zero' "
            "(scored as reward 0 in their groups: their complete events get return 0)."
        ),
    )
    frozen_policies: tuple[str, ...] = Field(
        (),
        description=(
            "Policies that are not trained (declared `frozen`, or external): their outputs stay members of "
            "the sets they belong to (counted in set_frozen_size, kept for completeness and provenance) but "
            "are not packed (no tokens, no log-ratio, no gradient); a set with no other member is not an "
            "event (counted in frozen_only_events). The trainer fills it from the workflow."
        ),
    )
    policies: tuple[str, ...] = Field(
        (),
        description=(
            "Fixed order of policy names: policy id = position, so ids stay stable across batches "
            "(a trainer indexes its models by them). Policies not listed are appended in order seen."
        ),
    )
