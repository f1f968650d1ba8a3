"""Advantages: one per event, or one per member for Dr. MAS (compiler stage).

Consumes an :class:`EventTable` (one row per kept event: its return, episode, task group,
transition, turn index and the agent of each member) and produces :class:`Advantages`. Knows
nothing about tokens or tensors of the batch.

Modes (:class:`AdvantageMode`), each a pure function in ``GROUPERS`` that says *what* is
normalized (the *units*) and *over which group*:

* ``transition`` (default, SRPO): a unit is an event; comparable events are those of the same
  task group and the same transition across the G episodes; the value is the event's return.
* ``episode``: a unit is an episode, its value the episode return, normalized over the G
  episodes of the task; every event of an episode gets its episode's advantage.
* ``agent`` (Dr. MAS, arXiv 2602.08847): a unit is a *member* (one agent output); the group is
  (task group, agent), so each agent's outputs are normalized over that agent's rows only; the
  value is the return of the event that consumed the output. Members of one set can then have
  different advantages: the batch keeps them per member (``member_advantage``), the member and
  token ratio units use them as they are, and the set unit uses their mean as the set's one
  advantage (docs/algorithm.md, "Dr. MAS and sets").

Loops and routes (``Grouping``): with ``pooled`` every firing of a transition (agent mode:
every output of an agent) of a task group is one group; with ``turn`` the key also holds the
turn index (the k-th firing in its episode), as AT-GRPO groups by (task, turn, agent). A unit
alone in its group (a route one rollout took, a turn only one rollout reached) is a
*singleton*: counted, and given advantage 0 or, with ``SingletonBaseline.EPISODE``, its
episode's advantage over the G episodes.

Normalization: ``A = (R - mean_g) / (std_g + eps)``, or ``R - mean_g`` without std (Dr.
GRPO). A group whose values do not vary (or that has one unit) gets advantage 0 and is
counted as a zero-variance group. Vectorized with ``index_add``; the tests check it against
a plain Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from srpo_graph.compiler.options import AdvantageMode, Grouping, SingletonBaseline

__all__ = ["AdvantageMode", "Advantages", "EventTable", "GROUPERS", "Grouping", "SingletonBaseline",
           "Units", "compute_advantages", "normalize"]

ZERO_VARIANCE_TOL = 1e-8


@dataclass(frozen=True)
class EventTable:
    """One row per event (lists of length S), and per episode (length E).

    ``members[s]`` lists the agent of each member of event s, in member order; ``turn[s]`` is
    how many earlier firings of the same transition its episode had; ``member_turn[s][j]``
    how many earlier outputs of the same agent (both default to 0: no loops).
    """

    returns: list[float]
    episode: list[int]
    group: list[str]  # the episode's task group id (same task, G samples)
    transition: list[str]
    members: list[list[str]]
    episode_reward: list[float]  # [E]
    turn: list[int] | None = None
    member_turn: list[list[int]] | None = None

    @property
    def num_members(self) -> int:
        return sum(len(m) for m in self.members)


@dataclass(frozen=True)
class Units:
    """What to normalize: ``values[U]`` in groups ``group[U]``; ``unit_of_member[M]`` maps back."""

    values: torch.Tensor  # [U] float64
    group: torch.Tensor  # [U] int64, 0..num_groups-1
    unit_episode: torch.Tensor  # [U] int64: the episode of each unit
    unit_of_member: torch.Tensor  # [M] int64
    num_groups: int


@dataclass(frozen=True)
class Advantages:
    advantage: torch.Tensor  # [S] float64: the set's one advantage (agent mode: its members' mean)
    member_advantage: torch.Tensor  # [M] float64: per member (equal to its set's outside agent mode)
    set_group: torch.Tensor  # [S] int64: the group the event (agent mode: its first member) was normalized in
    zero_variance_set: torch.Tensor  # [S] bool: every unit of the event is in a zero-variance group
    singleton_set: torch.Tensor  # [S] bool: some unit of the event is alone in its group
    num_zero_variance_groups: int  # includes the singleton groups
    num_singleton_groups: int
    num_groups: int


def _index(keys: list) -> torch.Tensor:
    table: dict = {}
    return torch.tensor([table.setdefault(k, len(table)) for k in keys], dtype=torch.int64)


def _num(group: torch.Tensor) -> int:
    return int(group.max()) + 1 if group.numel() else 0


def _member_set(events: EventTable) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(events.members)),
                                   torch.tensor([len(m) for m in events.members], dtype=torch.int64))


def group_by_transition(events: EventTable, grouping: Grouping = Grouping.POOLED) -> Units:
    turn = events.turn if events.turn is not None and grouping is Grouping.TURN else [0] * len(events.returns)
    group = _index([(events.group[i], events.transition[i], turn[i]) for i in range(len(events.returns))])
    return Units(torch.tensor(events.returns, dtype=torch.float64), group,
                 torch.tensor(events.episode, dtype=torch.int64), _member_set(events), _num(group))


def group_by_agent(events: EventTable, grouping: Grouping = Grouping.POOLED) -> Units:
    """Dr. MAS: one unit per member, group (task group, agent[, the agent's turn])."""
    keys, values, episode = [], [], []
    for i, agents in enumerate(events.members):
        turns = (
            events.member_turn[i] if events.member_turn is not None and grouping is Grouping.TURN else [0] * len(agents)
        )
        for agent, turn in zip(agents, turns):
            keys.append((events.group[i], agent, turn))
            values.append(events.returns[i])
            episode.append(events.episode[i])
    group = _index(keys)
    return Units(
        torch.tensor(values, dtype=torch.float64),
        group,
        torch.tensor(episode, dtype=torch.int64),
        torch.arange(len(values)),
        _num(group),
    )


def group_by_episode(events: EventTable, grouping: Grouping = Grouping.POOLED) -> Units:
    """Units are the episodes that have at least one event; groups are their task groups."""
    ep_ids = sorted(set(events.episode))
    unit = {e: u for u, e in enumerate(ep_ids)}
    ep_group = {e: events.group[i] for i, e in enumerate(events.episode)}
    group = _index([ep_group[e] for e in ep_ids])
    of_set = torch.tensor([unit[e] for e in events.episode], dtype=torch.int64)
    return Units(
        torch.tensor([events.episode_reward[e] for e in ep_ids], dtype=torch.float64),
        group,
        torch.tensor(ep_ids, dtype=torch.int64),
        of_set[_member_set(events)],
        _num(group),
    )


GROUPERS: dict[AdvantageMode, Callable[[EventTable, Grouping], Units]] = {
    AdvantageMode.TRANSITION: group_by_transition,
    AdvantageMode.EPISODE: group_by_episode,
    AdvantageMode.AGENT: group_by_agent,
}


def normalize(
    values: torch.Tensor,
    group: torch.Tensor,
    num_groups: int,
    *,
    use_std: bool = True,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
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


def compute_advantages(
    events: EventTable,
    mode: AdvantageMode = AdvantageMode.TRANSITION,
    *,
    grouping: Grouping = Grouping.POOLED,
    singleton_baseline: SingletonBaseline = SingletonBaseline.ZERO,
    use_std: bool = True,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> Advantages:
    """Advantages of every event and member.

    Args:
        events: the event table. mode: how units are grouped (module docstring).
        grouping: pooled, or by turn index. singleton_baseline: what a lone unit gets.
        use_std, eps, unbiased: see :func:`normalize`.
    Returns:
        :class:`Advantages`.

    >>> ev = EventTable(returns=[1.0, 0.0, 1.0], episode=[0, 1, 1], group=["g", "g", "g"],
    ...                 transition=["t", "t", "u"], members=[["a"], ["a"], ["b"]], episode_reward=[1.0, 0.0])
    >>> [round(x, 3) for x in compute_advantages(ev).advantage.tolist()]
    [0.707, -0.707, 0.0]
    """
    mode, grouping, singleton_baseline = AdvantageMode(mode), Grouping(grouping), SingletonBaseline(singleton_baseline)
    u = GROUPERS[mode](events, grouping)
    adv, zero = normalize(u.values, u.group, u.num_groups, use_std=use_std, eps=eps, unbiased=unbiased)
    count = torch.bincount(u.group, minlength=u.num_groups)
    single = (count == 1)[u.group]  # [U]
    if singleton_baseline is SingletonBaseline.EPISODE and mode is not AdvantageMode.EPISODE and bool(single.any()):
        e = group_by_episode(events)
        adv_e, _ = normalize(e.values, e.group, e.num_groups, use_std=use_std, eps=eps, unbiased=unbiased)
        by_episode = torch.zeros(len(events.episode_reward), dtype=torch.float64)
        by_episode[e.unit_episode] = adv_e
        adv = torch.where(single, by_episode[u.unit_episode], adv)
    S = len(events.returns)
    member_set = _member_set(events)
    member_adv = adv[u.unit_of_member]
    k = torch.bincount(member_set, minlength=S).to(torch.float64).clamp(min=1)
    set_adv = torch.zeros(S, dtype=torch.float64).index_add_(0, member_set, member_adv) / k
    first = torch.zeros(S, dtype=torch.int64)
    if member_set.numel():
        first = torch.full((S,), member_set.numel(), dtype=torch.int64).scatter_reduce_(
            0, member_set, torch.arange(member_set.numel()), reduce="amin"
        )
    unit_zero = zero[u.group][u.unit_of_member].to(torch.int64)
    unit_single = single[u.unit_of_member].to(torch.int64)
    all_zero = torch.ones(S, dtype=torch.int64).scatter_reduce_(0, member_set, unit_zero, reduce="amin")
    any_single = torch.zeros(S, dtype=torch.int64).scatter_reduce_(0, member_set, unit_single, reduce="amax")
    return Advantages(
        advantage=set_adv,
        member_advantage=member_adv,
        set_group=u.group[u.unit_of_member[first]] if S else torch.zeros(0, dtype=torch.int64),
        zero_variance_set=all_zero.bool(),
        singleton_set=any_single.bool(),
        num_zero_variance_groups=int(zero.sum()),
        num_singleton_groups=int((count == 1).sum()),
        num_groups=u.num_groups,
    )
