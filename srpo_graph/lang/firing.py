"""The firing rule: one definition that the runtime runs and the checker explores.

Stage: lang (shared with the runtime, which imports it). Consumes a
:class:`~srpo_graph.workflow.Workflow` and an episode's abstract state (which agents are
*pending*, which have *fresh* outputs, how often each transition fired); knows nothing about
models, tokens or values other than route labels.

Note [Firing semantics]
    * An activated agent is *pending* until it produces one output; activating an agent that is
      already pending does nothing. All pending agents of an episode are generated in one round.
    * A transition is *ready* when none of the agents it consumes is pending and at least one
      of them has a fresh (unconsumed) output. Of the ready transitions the first declared fires;
      firings repeat until none is ready, then the next generation round starts.
    * A firing takes **one output per consumed agent: its latest fresh one**. The active set is
      those outputs, so its size is the number of consumed agents with a fresh output (never two
      outputs of one agent). An older fresh output of the same agent -- possible when a loop
      re-activates the agent before its consumer fires -- is *superseded*: the trace lists it on
      the firing (``TransitionRecord.superseded``), it gets no credit, and `check` warns where
      the workflow allows it (code ``superseded``).
    * Before firing: ``max_steps`` firings done, or the transition's ``max_rounds`` used up, ends
      the episode ``truncated``. After firing, activating an agent whose consumer can no longer
      fire (same two bounds) ends it ``truncated`` at once.
    * When nothing is ready and nothing is pending, the episode ends ``ok`` if ``end`` was
      activated, else it stalls (``failed``).

:func:`srpo_graph.lang.explore.explore` runs these same functions over every route choice to
prove each transition's set sizes and what is produced before each reader.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping, Sequence
from typing import Any

from srpo_graph.workflow import END, ActivateAgents, ActivateEnd, ActivateRoute, Transition


def is_ready(t: Transition, fresh: Container[str], pending: Container[str]) -> bool:
    """No consumed agent is pending and at least one has a fresh output (``a in fresh``)."""
    some = False
    for a in t.consume:
        if a in pending:
            return False
        some = some or a in fresh
    return some


def first_ready(transitions: Sequence[Transition], candidates: Sequence[int], fresh: Container[str],
                pending: Container[str]) -> Transition | None:
    """The first declared ready transition among ``candidates`` (indices in declaration order)."""
    return next((transitions[i] for i in candidates if is_ready(transitions[i], fresh, pending)), None)


def take(t: Transition, fresh: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """Remove ``t``'s consumed agents from ``fresh``: (the active set: the latest output of each,
    the older fresh outputs it supersedes)."""
    consumed: list[str] = []
    superseded: list[str] = []
    for a in t.consume:
        ids = fresh.pop(a, None)
        if ids:
            consumed.append(ids[-1])
            superseded.extend(ids[:-1])
    return consumed, superseded


def over_budget(t: Transition, steps: int, rounds: Mapping[str, int], max_steps: int) -> bool:
    """Firing ``t`` now would exceed ``max_steps`` or its ``max_rounds``: the episode is truncated."""
    return steps >= max_steps or (t.max_rounds is not None and rounds.get(t.name, 0) >= t.max_rounds)


def exhausted(agent: str, bounded: Mapping[str, tuple[str, int]], rounds: Mapping[str, int]) -> bool:
    """``agent``'s consumer has a ``max_rounds`` (``bounded``: agent -> (consumer, bound)) it used up."""
    bound = bounded.get(agent)
    return bound is not None and rounds.get(bound[0], 0) >= bound[1]


def truncates_after(activated: Collection[str], steps: int, rounds: Mapping[str, int], max_steps: int,
                    bounded: Mapping[str, tuple[str, int]]) -> bool:
    """After a firing: an activated agent could never be consumed (bounds used up)."""
    agents = [a for a in activated if a != END]
    return bool(agents) and (steps >= max_steps or any(exhausted(a, bounded, rounds) for a in agents))


def route_targets(act: ActivateRoute, value: Any) -> tuple[str, ...]:
    """What a route activates for the subject's ``value`` (a label, a list of labels, or None):
    each label's agents in order; a None choice or an undeclared label activates ``end`` only."""
    labels = value if isinstance(value, list) else [value]
    targets: list[str] = []
    for label in labels:
        for a in act.targets(label) if isinstance(label, str) else (END,):
            if a not in targets:
                targets.append(a)
    return tuple(targets) or (END,)


def fixed_targets(t: Transition) -> tuple[str, ...] | None:
    """The activation of a fixed ``activate`` (a list, or ``end``); None for a route."""
    if isinstance(t.activate, ActivateEnd):
        return (END,)
    if isinstance(t.activate, ActivateAgents):
        return t.activate.agents
    return None


def bounded_consumers(transitions: Sequence[Transition]) -> dict[str, tuple[str, int]]:
    """agent -> (its consumer, that consumer's ``max_rounds``), for consumers with a bound (a
    checked workflow has one consumer per agent; otherwise the last, as ``Workflow.consumer_of``)."""
    consumer = {a: t for t in transitions for a in t.consume}
    return {a: (t.name, t.max_rounds) for a, t in consumer.items() if t.max_rounds is not None}
