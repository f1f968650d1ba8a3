"""Advantages, one per event (compiler stage).

Consumes an :class:`EventTable` (one row per kept event: its return, its episode, its group
and transition names, the agents of its set) and produces one advantage per event plus the
group each event was normalized in. Knows nothing about tokens or tensors of the batch.

Modes (:class:`AdvantageMode`), each a pure function in ``GROUPERS`` that says *what* is
normalized and *over which group*:

* ``transition`` (default, SRPO): comparable events are those of the same task group and
  the same transition across the G episodes; the value is the event's return.
* ``episode``: the episode return, normalized over the G episodes of the group; every event
  of an episode gets its episode's advantage.
* ``agent`` (Dr. MAS): group key (task group, agents of the set), the value is the event's
  return.

Normalization: ``A = (R - mean_g) / (std_g + eps)``, or ``R - mean_g`` without std
(Dr. GRPO). A group whose values do not vary (or that has one member) gets advantage 0 and
is counted as a zero-variance group. Everything is vectorized with ``index_add``; the tests
check it against a plain Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

import torch

ZERO_VARIANCE_TOL = 1e-8


class AdvantageMode(str, Enum):
    TRANSITION = "transition"
    EPISODE = "episode"
    AGENT = "agent"


@dataclass(frozen=True)
class EventTable:
    """One row per event (all lists of length S)."""

    returns: list[float]  # the event's return (reward-to-go or episode total, see CompileConfig)
    episode: list[int]  # index of the event's episode
    group: list[str]  # the episode's group id (same task, G samples)
    transition: list[str]  # transition name
    agents: list[str]  # agents of the set, sorted and joined with "+"
    episode_reward: list[float]  # per episode (length E): the episode's total reward


@dataclass(frozen=True)
class Grouping:
    """What to normalize: ``values[U]`` in groups ``group[U]``; ``unit_of_set[S]`` maps back."""

    values: torch.Tensor  # [U] float64
    group: torch.Tensor  # [U] int64, 0..G-1
    unit_of_set: torch.Tensor  # [S] int64
    num_groups: int


@dataclass(frozen=True)
class Advantages:
    advantage: torch.Tensor  # [S] float64
    set_group: torch.Tensor  # [S] int64: the group each event was normalized in
    zero_variance_set: torch.Tensor  # [S] bool: the event's group has zero variance
    num_zero_variance_groups: int
    num_groups: int


def _index(keys: list) -> torch.Tensor:
    table: dict = {}
    return torch.tensor([table.setdefault(k, len(table)) for k in keys], dtype=torch.int64)


def _by_event(events: EventTable, key: Callable[[int], tuple]) -> Grouping:
    group = _index([key(i) for i in range(len(events.returns))])
    n = len(events.returns)
    return Grouping(
        values=torch.tensor(events.returns, dtype=torch.float64),
        group=group,
        unit_of_set=torch.arange(n),
        num_groups=int(group.max()) + 1 if n else 0,
    )


def group_by_transition(events: EventTable) -> Grouping:
    return _by_event(events, lambda i: (events.group[i], events.transition[i]))


def group_by_agent(events: EventTable) -> Grouping:
    return _by_event(events, lambda i: (events.group[i], events.agents[i]))


def group_by_episode(events: EventTable) -> Grouping:
    # units are the episodes that have at least one event; groups are their task groups
    ep_ids = sorted(set(events.episode))
    unit = {e: u for u, e in enumerate(ep_ids)}
    ep_group = {e: events.group[i] for i, e in enumerate(events.episode)}
    group = _index([ep_group[e] for e in ep_ids])
    return Grouping(
        values=torch.tensor([events.episode_reward[e] for e in ep_ids], dtype=torch.float64),
        group=group,
        unit_of_set=torch.tensor([unit[e] for e in events.episode], dtype=torch.int64),
        num_groups=int(group.max()) + 1 if ep_ids else 0,
    )


GROUPERS: dict[AdvantageMode, Callable[[EventTable], Grouping]] = {
    AdvantageMode.TRANSITION: group_by_transition,
    AdvantageMode.EPISODE: group_by_episode,
    AdvantageMode.AGENT: group_by_agent,
}


def normalize(values: torch.Tensor, group: torch.Tensor, num_groups: int, *, use_std: bool = True,
              eps: float = 1e-6, unbiased: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative normalization with segment sums.

    Args:
        values: [U] float64. group: [U] int64 in ``0..num_groups-1``.
        use_std: divide by the group's std (+ eps); False = Dr. GRPO (mean only).
        eps: added to the std. unbiased: sample std (n-1), as TRL and verl use.
    Returns:
        (advantage [U], zero_variance [num_groups] bool). Zero-variance groups (including
        one-member groups) give advantage 0.

    >>> a, z = normalize(torch.tensor([1., 0., 2., 2.], dtype=torch.float64), torch.tensor([0, 0, 1, 1]), 2)
    >>> [round(x, 4) for x in a.tolist()], z.tolist()
    ([0.7071, -0.7071, 0.0, 0.0], [False, True])
    """
    dt = torch.float64
    count = torch.zeros(num_groups, dtype=dt).index_add_(0, group, torch.ones_like(values, dtype=dt))
    total = torch.zeros(num_groups, dtype=dt).index_add_(0, group, values.to(dt))
    mean = total / count.clamp(min=1)
    centered = values.to(dt) - mean[group]
    sq = torch.zeros(num_groups, dtype=dt).index_add_(0, group, centered * centered)
    denom = (count - 1).clamp(min=1) if unbiased else count.clamp(min=1)
    std = (sq / denom).sqrt()
    zero = (count < 2) | (std <= ZERO_VARIANCE_TOL)
    adv = centered / (std[group] + eps) if use_std else centered
    adv = torch.where(zero[group], torch.zeros_like(adv), adv)
    return adv, zero


def compute_advantages(events: EventTable, mode: AdvantageMode = AdvantageMode.TRANSITION, *,
                       use_std: bool = True, eps: float = 1e-6, unbiased: bool = True) -> Advantages:
    """One advantage per event.

    Args:
        events: the event table. mode: how events are grouped (see module docstring).
        use_std, eps, unbiased: see :func:`normalize`.
    Returns:
        :class:`Advantages`.

    >>> ev = EventTable(returns=[1.0, 0.0, 1.0], episode=[0, 1, 1], group=["g", "g", "g"],
    ...                 transition=["t", "t", "u"], agents=["a", "a", "b"], episode_reward=[1.0, 0.0])
    >>> [round(x, 3) for x in compute_advantages(ev).advantage.tolist()]
    [0.707, -0.707, 0.0]
    """
    g = GROUPERS[AdvantageMode(mode)](events)
    adv, zero = normalize(g.values, g.group, g.num_groups, use_std=use_std, eps=eps, unbiased=unbiased)
    zero_unit = zero[g.group]
    return Advantages(
        advantage=adv[g.unit_of_set],
        set_group=g.group[g.unit_of_set],
        zero_variance_set=zero_unit[g.unit_of_set],
        num_zero_variance_groups=int(zero.sum()),
        num_groups=g.num_groups,
    )
