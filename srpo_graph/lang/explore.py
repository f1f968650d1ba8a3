"""Explore every run of a workflow under the runtime's own firing rule (lang stage, check).

Consumes a draft :class:`~srpo_graph.workflow.Workflow` (names and types resolved) and runs the
functions of :mod:`srpo_graph.lang.firing` -- the ones ``runtime/episode.py`` runs -- on an
abstract episode: values are unknown except route labels, so at every route the exploration
follows each label the subject's type allows; for ``choices[...]`` every non-empty subset. An
unreadable label (``None``) activates ``end`` and adds no set size; it is not followed, so the
data-flow facts hold for runs whose routers produced a label (as before this module). States are memoized; the
exploration
stops at ``MAX_STATES`` (then ``complete`` is False and its facts are partial).

What it proves, for the analysis (``analysis.py``) and ``check``'s summary:

* each transition's possible active-set sizes (Note [Firing semantics]: the consumed agents
  that have a fresh output when it fires);
* what is surely produced (agent values and tool results) before each reader: when each agent
  is generated (its template and extractor arguments), when each transition fires (its tools;
  its reward and route read that plus its tools), when an episode ends ``ok`` (the terminal
  reward) -- one least-fixpoint rule for every reader;
* where a loop can re-activate an agent whose previous output is still unconsumed (that output
  would be superseded: a warning).

>>> from srpo_graph.lang import parse, check
>>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" output: int }'
...                 ' transition t { consume: a activate: end } start: a'))
>>> explore(w).set_sizes
{'t': {1}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from srpo_graph.lang import firing
from srpo_graph.workflow import END, ActivateRoute, ChoiceType, Workflow

MAX_STATES = 20_000  # abstract episode states explored before the facts are declared partial
MAX_ROUTE_SUBSETS = 12  # a choices[...] router with more labels: singletons, all, and None only


@dataclass
class Exploration:
    """What every explored run shows (see the module docstring)."""

    set_sizes: dict[str, set[int]] = field(default_factory=dict)  # transition -> sizes seen
    before_agent: dict[str, frozenset[str]] = field(default_factory=dict)  # agent -> surely produced when generated
    at_firing: dict[str, frozenset[str]] = field(default_factory=dict)  # transition -> surely produced when it fires
    at_end: frozenset[str] | None = None  # surely produced when an episode ends ok (None: none does)
    superseded: dict[tuple[str, str], None] = field(default_factory=dict)  # (activating transition, agent)
    complete: bool = True
    num_states: int = 0


def subject_type(w: Workflow, act: ActivateRoute) -> Any:
    """The type of a route's subject -- an agent's output, a tool's result (``-> Literal[...]``)
    or a task field -- then its record fields; None when unknown."""
    head, *fields = act.on.path
    if head == "task" and fields:
        t = dict(w.task_fields).get(fields.pop(0))
    else:
        agent = {a.name: a for a in w.agents}.get(head)
        tools = {tc.name: tc.type for tr in w.transitions for tc in tr.tools}
        t = agent.output if agent is not None else tools.get(head)
    for f in fields:
        t = t.field_type(f) if t is not None and hasattr(t, "field_type") else None
    return t


def max_picks(w: Workflow, act: ActivateRoute) -> int:
    """How many labels one firing of a ``choices`` router can pick: every label, except for an
    agent read by ``std.digit_choices`` whose ``allow`` list holds single digits only -- each
    generated token is then one index digit, so ``max_tokens`` digits pick at most that many
    labels (``max_tokens: 1`` makes it a one-label router)."""
    agent = {a.name: a for a in w.agents}.get(act.on.path[0])
    t = subject_type(w, act)
    n = len(t.options) if isinstance(t, ChoiceType) else len(act.cases)
    ex = agent.extractor if agent is not None else None
    if (
        agent is None
        or ex is None
        or len(act.on.path) > 1
        or (ex.module, ex.function) != ("srpo_graph.std", "digit_choices")
    ):
        return n
    allow = agent.sampling.allow
    if not allow or not all(len(x) == 1 and x.isdigit() for x in allow):
        return n
    return max(1, min(n, agent.sampling.max_tokens))


def route_values(w: Workflow, act: ActivateRoute) -> tuple[list[Any], bool]:
    """The subject values a route can see, and whether that list is exhaustive."""
    t = subject_type(w, act)
    if not isinstance(t, ChoiceType):
        return [None], True
    if not t.multi:
        return list(t.options), True
    if len(t.options) <= MAX_ROUTE_SUBSETS:
        picks = max_picks(w, act)
        return [list(c) for k in range(1, picks + 1) for c in combinations(t.options, k)], True
    return [*([o] for o in t.options), list(t.options)], False


# Note [Unreadable route values]
# A route reads an agent's output, and an extractor may fail to read it (value None): the runtime
# then activates `end` only (firing.route_targets), and transitions still fire on the fresh
# outputs left -- possibly with fewer members than usual. So that branch is explored too and its
# set sizes are proved; what it makes available is not counted (a reader that then misses a value
# fails its episode, naming it, as with any unreadable output), so no workflow is refused for it.


def _meet(table: dict[str, frozenset[str]], key: str, have: frozenset[str]) -> None:
    table[key] = table[key] & have if key in table else have


def explore(w: Workflow) -> Exploration:
    """Run every route choice of ``w`` under :mod:`~srpo_graph.lang.firing` (module docstring)."""
    ts = w.transitions
    bounded = firing.bounded_consumers(ts)
    index = {t.name: i for i, t in enumerate(ts)}
    outcomes: list[list[tuple[tuple[str, ...], bool]]] = []  # per transition: (targets, from an unreadable value)
    out = Exploration()
    agents = {a.name for a in w.agents}
    for t in ts:
        fixed = firing.fixed_targets(t)
        if fixed is not None:
            outcomes.append([(fixed, False)])
            continue
        assert isinstance(t.activate, ActivateRoute)
        values, exhaustive = route_values(w, t.activate)
        out.complete &= exhaustive
        routes = list(dict.fromkeys(firing.route_targets(t.activate, v) for v in values))
        outcome = [(r, False) for r in routes]
        if t.activate.on.path[0] in agents and (END,) not in routes:
            # an agent's output may not parse (its value is None, Note [Unreadable route values]):
            # the runtime then activates `end` only, and the fresh outputs left are still consumed
            outcome.append(((END,), True))
        outcomes.append(outcome)
    # a state at the top of the runtime's ``advance``: (pending, fresh, rounds, end activated, produced,
    # reached through an unreadable route value)
    State = tuple[frozenset[str], frozenset[str], tuple[int, ...], bool, frozenset[str], bool]
    start: State = (frozenset(w.start), frozenset(), (0,) * len(ts), False, frozenset(), False)
    seen: set[State] = {start}
    stack: list[State] = [start]
    while stack:
        if len(seen) > MAX_STATES:
            out.complete = False
            break
        pending, fresh, rounds_t, end, produced, unreadable = stack.pop()
        while True:
            candidates = [i for i, t in enumerate(ts) if any(a in fresh for a in t.consume)]
            ready = firing.first_ready(ts, candidates, fresh, pending)
            if ready is None:
                if not pending:
                    if end and not unreadable:  # ends ok (otherwise it stalls: failed)
                        out.at_end = produced if out.at_end is None else out.at_end & produced
                    break
                for a in pending:  # one generation round: every pending agent, prompts rendered first
                    if not unreadable:
                        _meet(out.before_agent, a, produced)
                produced, fresh, pending = produced | pending, fresh | pending, frozenset()
                continue
            rounds = {x.name: rounds_t[i] for i, x in enumerate(ts)}
            steps = sum(rounds_t)
            if firing.over_budget(ready, steps, rounds, w.max_steps):
                break  # truncated
            out.set_sizes.setdefault(ready.name, set()).add(sum(a in fresh for a in ready.consume))
            if not unreadable:
                _meet(out.at_firing, ready.name, produced)
            fresh = fresh - set(ready.consume)
            produced = produced | {tc.name for tc in ready.tools}
            rounds[ready.name] += 1
            new_rounds = tuple(rounds[x.name] for x in ts)
            for targets, from_none in outcomes[index[ready.name]]:
                act = [a for a in targets if a != END and a not in pending]
                for a in act:
                    if a in fresh:  # its older output is still unconsumed: it will be superseded
                        out.superseded[(ready.name, a)] = None
                if firing.truncates_after(targets, steps + 1, rounds, w.max_steps, bounded):
                    continue
                nxt: State = (
                    pending | set(act),
                    fresh,
                    new_rounds,
                    end or END in targets,
                    produced,
                    unreadable or from_none,
                )
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
            break
    out.num_states = len(seen)
    return out
