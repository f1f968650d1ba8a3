"""Check one transition declaration: what it consumes, its tools and reward, what it activates.

Stage: lang (check). Consumes an :class:`~srpo_graph.lang.ast.TransitionDecl` and the checker's
:class:`~srpo_graph.lang.scope.Scope`; produces a :class:`~srpo_graph.workflow.Transition`
(set sizes still empty: :mod:`srpo_graph.lang.analysis` proves them) and records the references
whose availability depends on paths. Routing rules live here: a router's subject must be a
choice, and its labels (or explicit cases) must name agents or ``end``.
"""

from __future__ import annotations

from srpo_graph.errors import Span
from srpo_graph.lang import ast
from srpo_graph.lang.scope import ITEM_WORD, MAX_COUNT, Scope, close_names
from srpo_graph.workflow import (
    END,
    ActivateAgents,
    ActivateEnd,
    ActivateRoute,
    ChoiceType,
    Ref,
    ToolCall,
    Transition,
    type_str,
)


def build_transition(scope: Scope, t: ast.TransitionDecl) -> Transition | None:
    """The transition ``t`` declares, or None when it activates nothing (reported)."""
    name = t.name.value
    errors_before = len(scope.sink.errors)
    by_kind: dict[type, list] = {}
    for i in t.items:
        by_kind.setdefault(type(i), []).append(i)
    for kind in (ast.ConsumeItem, ast.RewardItem, ast.ActivateItem, ast.MaxRoundsItem):
        for extra in by_kind.get(kind, [])[1:]:
            first = by_kind[kind][0]
            scope.err(f"transition '{name}' sets `{ITEM_WORD[kind]}` twice", extra.span,
                      f"keep one `{ITEM_WORD[kind]}` (the first is on line {first.span.line}) and delete this one",
                      "duplicate-name")
    consume_item = by_kind.get(ast.ConsumeItem, [None])[0]
    consume: list[str] = []
    if consume_item is None:
        scope.err(f"transition '{name}' consumes nothing", t.name.span, "add `consume: AGENT, ...`", "missing-consume")
    else:
        seen: dict[str, Span] = {}
        for n in consume_item.agents:
            if n.value not in scope.agent_types:
                scope.err(f"transition '{name}' consumes unknown agent '{n.value}'", n.span,
                         close_names(n.value, scope.agent_types), "unknown-name")
            elif scope.unique(n, seen, "consumed agent"):
                consume.append(n.value)
                scope.uses.consume_spans[(name, n.value)] = n.span
    tools = []
    tool_refs: list[tuple[int, Ref]] = []
    for k, ti in enumerate(by_kind.get(ast.ToolItem, [])):
        refs: list[Ref] = []
        call = scope.call(ti.call, "tool", refs)
        tool_refs.extend((k, r) for r in refs)
        if call is not None and ti.name.value in scope.tool_types:
            tools.append(ToolCall(name=ti.name.value, call=call, type=scope.tool_types[ti.name.value], span=ti.span))
    scope.uses.tool_refs[name] = tool_refs
    reward = None
    for ri in by_kind.get(ast.RewardItem, [])[:1]:
        refs = []
        reward = scope.reward(ri.call, refs)
        scope.uses.reward_refs[name] = refs
    act_item = by_kind.get(ast.ActivateItem, [None])[0]
    activation = None
    if act_item is None:
        scope.err(f"transition '{name}' activates nothing", t.name.span,
                 "add `activate: AGENT, ...`, `activate: end` or `activate: route ...`", "missing-activate")
    else:
        activation = activation_of(scope, name, act_item.activation)
    max_rounds = None
    for mr in by_kind.get(ast.MaxRoundsItem, [])[:1]:
        if not 1 <= mr.value.value <= MAX_COUNT:
            scope.err(f"`max_rounds` must be in [1, {MAX_COUNT}]", mr.value.span,
                      "how often this transition may fire per episode, e.g. `max_rounds: 3`", "bad-value")
        else:
            max_rounds = int(mr.value.value)
    if activation is None:
        scope.uses.incomplete = True
        return None
    return scope.node(
        Transition,
        errors_before,
        node="transition",
        name=name,
        consume=tuple(consume),
        tools=tuple(tools),
        reward=reward,
        activate=activation,
        max_rounds=max_rounds,
        set_sizes=(),
        span=t.span,
    )


# `route` written where an agent name stands (the parser names the same mistake when it can)
ROUTE_AS_AGENT = (
    "`route` is a keyword of `activate:`, not an agent",
    "to activate agents list them (`activate: a, b`); to route on a choice write "
    "`activate: route AGENT { label -> AGENT, ... }` on its own",
)


def activation_of(scope: Scope, tname: str, act: ast.Activation) -> ActivateEnd | ActivateAgents | ActivateRoute:
    """What transition ``tname`` activates: `end`, fixed agents, or a route on a choice output."""
    if isinstance(act, ast.ActivateEnd):
        return ActivateEnd()
    if isinstance(act, ast.ActivateAgents):
        names: list[str] = []
        seen_act: dict[str, Span] = {}
        for n in act.agents:
            if n.value == "route":
                scope.err(ROUTE_AS_AGENT[0], n.span, ROUTE_AS_AGENT[1], "bad-route")
            elif n.value not in scope.agent_types:
                scope.err(
                    f"transition '{tname}' activates unknown agent '{n.value}'",
                    n.span,
                    close_names(n.value, scope.agent_types),
                    "unknown-name",
                )
            elif scope.unique(n, seen_act, "activated agent"):  # like `start:`: one activation per agent
                names.append(n.value)
        return ActivateAgents(agents=tuple(names))
    on = Ref(path=act.on.path, optional=act.on.optional, span=act.on.span)
    scope.uses.route_refs[tname] = on
    t = scope.ref_type(act.on)
    if t is None or not isinstance(t, ChoiceType):
        scope.uses.incomplete = True  # no targets known: the rules about `end` would only add noise
    if t is None:
        return ActivateRoute(on=on, cases=())
    if not isinstance(t, ChoiceType):
        scope.err(
            f"cannot route on '{on}': it is {type_str(t)}, not a choice",
            act.on.span,
            "route on a value of type `choice[...]` or `choices[...]` (an agent's output, or a tool annotated `-> "
            "Literal[...]`)",
            "type-mismatch",
        )
        return ActivateRoute(on=on, cases=())
    cases: list[tuple[str, tuple[str, ...]]] = []
    if act.cases is None:
        for label in t.options:
            if label != END and label not in scope.agent_types:
                scope.err(
                    f"router choice '{label}' is not an agent",
                    act.on.span,
                    f"the labels of {type_str(t)} must name agents (or end), or give explicit cases:"
                    f" route {on} {{ {label} -> AGENT }}",
                    "router-target",
                )
            cases.append((label, (END,) if label == END else (label,)))
        return ActivateRoute(on=on, cases=tuple(cases))
    seen: dict[str, Span] = {}
    for case in act.cases:
        if case.label.value not in t.options:
            scope.err(
                f"'{case.label.value}' is not a label of {type_str(t)}",
                case.label.span,
                close_names(case.label.value, t.options),
                "router-target",
            )
            continue
        if not scope.unique(case.label, seen, "route case"):
            continue
        targets: list[str] = []
        seen_targets: dict[str, Span] = {}
        for n in case.targets:
            if n.value != END and n.value not in scope.agent_types:
                scope.err(
                    f"route case '{case.label.value}' names '{n.value}', which is not an agent",
                    n.span,
                    close_names(n.value, list(scope.agent_types) + [END]),
                    "router-target",
                )
            elif scope.unique(n, seen_targets, "route target"):
                targets.append(n.value)
        cases.append((case.label.value, tuple(targets)))
    for label in t.options:
        if label not in seen:
            scope.sink.warning(
                f"route on '{on}' has no case for '{label}': that choice ends the episode",
                act.span,
                f"add `{label} -> end` to say so",
                "route-default",
            )
            # spelled out, so every graph rule sees the episode end there (as the runtime does)
            cases.append((label, (END,)))
    return ActivateRoute(on=on, cases=tuple(cases))
