"""Graph rules and static facts of a checked workflow.

Stage: lang (check). Consumes the draft :class:`~srpo_graph.workflow.Workflow` the checker
built (names and types already resolved) and reports, into the checker's diagnostics:

* every agent output is consumed by exactly one transition (``unconsumed: allow`` makes a
  missing consumer a warning);
* every node is reachable from ``start`` and can reach ``end``;
* every cycle passes through a transition with ``max_rounds`` (reported as a path);
* every unmarked reference (``{x}``, call arguments, route subjects) is produced on every
  path before it is read (a forward "must" data-flow analysis over the routing graph).

It also proves each transition's possible active-set sizes and a bound on transition firings
per episode (see Note [Set sizes]).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import networkx as nx

from srpo_graph.errors import DiagnosticSink, Span
from srpo_graph.workflow import END, ActivateAgents, ActivateEnd, ActivateRoute, ChoiceType, Transition, Workflow

MAX_ROUTE_SUBSETS = 12  # a choices[...] router with more labels: sizes are bounded, not enumerated


@dataclass
class Analysis:
    transitions: list[Transition]
    max_firings: int = 0
    bound_reason: str = ""


def analyze(draft: Workflow, sink: DiagnosticSink, name_spans: dict[str, Span], uses) -> Analysis:
    """Run the graph rules on ``draft`` (errors go to ``sink``) and prove its static facts."""
    g = draft.graph()
    agents = {a.name: a for a in draft.agents}
    trans = {t.name: t for t in draft.transitions}
    span_of = lambda n: name_spans.get(n)  # noqa: E731

    # -- consumption: exactly one transition per agent -------------------------------------
    consumers: dict[str, list[str]] = {a: [] for a in agents}
    for t in draft.transitions:
        for a in t.consume:
            consumers.setdefault(a, []).append(t.name)
    for a, ts in consumers.items():
        if not ts:
            if a in uses.unconsumed_ok:
                sink.warning(f"the output of agent '{a}' is not consumed by any transition (allowed)", span_of(a),
                             code="unconsumed")
            else:
                sink.error(f"the output of agent '{a}' is not consumed by any transition", span_of(a),
                           "consume it in a transition (`consume: " + a + "`), or write `unconsumed: allow` in the"
                           " agent: an output nobody consumes gets no credit", "unconsumed")
        for extra in ts[1:]:
            sink.error(f"agent '{a}' is consumed by two transitions ('{ts[0]}' and '{extra}')",
                       uses.consume_spans.get((extra, a), span_of(extra)),
                       "an output belongs to exactly one active set: consume it in one transition", "double-consume")

    # -- reachability ----------------------------------------------------------------------
    # A broken `activate` (missing, or a route on a non-choice) hides edges: the rules below
    # would only repeat that error as noise, so they wait until it is fixed.
    nodes = list(agents) + list(trans)
    reach = nx.descendants(g, "start") if "start" in g else set()
    if not uses.incomplete and draft.start:
        for n in nodes:
            if n not in reach:
                kind = "agent" if n in agents else "transition"
                sink.error(f"{kind} '{n}' is unreachable from start: {_why_unreachable(g, n, kind)}", span_of(n),
                           "activate it from a transition (or list it in `start:`), or delete it", "unreachable")
    if not uses.incomplete:
        # an agent nobody consumes ends its branch (and has its own diagnostic above)
        ends = g.copy()
        ends.add_edges_from((a, END) for a, ts in consumers.items() if not ts)
        to_end = nx.ancestors(ends, END) if END in ends else set()
        for n in nodes:
            if n in reach and n not in to_end:
                kind = "agent" if n in agents else "transition"
                sink.error(f"{kind} '{n}' cannot reach end: {_why_no_end(g, n)}", span_of(n),
                           "every path must be able to finish: activate `end` (or a route case `-> end`) downstream",
                           "no-end")

    # -- cycles: each must pass through a transition with max_rounds --------------------------
    h = g.copy()
    h.remove_nodes_from([n for n in ("start", END)] + [t.name for t in draft.transitions if t.max_rounds])
    for scc in nx.strongly_connected_components(h):
        if len(scc) < 2:
            continue
        cycle = nx.find_cycle(h.subgraph(scc))
        path = [cycle[0][0]] + [e[1] for e in cycle]
        first_t = next((n for n in path if n in trans), path[0])
        sink.error(f"unbounded cycle: {' -> '.join(path)}", span_of(first_t),
                   f"add `max_rounds: N` to a transition on the cycle (e.g. '{first_t}')", "unbounded-cycle")

    # -- set sizes and the data-flow of references -------------------------------------------
    events = _activation_events(draft)
    with_sizes = []
    for t in draft.transitions:
        sizes = sorted({len(e & set(t.consume)) for e in events} - {0})
        with_sizes.append(t.model_copy(update={"set_sizes": tuple(sizes) or (len(t.consume),)}))
    _check_availability(draft, with_sizes, events, sink, uses)
    bound, reason = _firing_bound(g, draft.model_copy(update={"transitions": tuple(with_sizes)}))
    return Analysis(with_sizes, bound, reason)


# Note [Set sizes]
# An active set is the fresh outputs a transition takes when it fires. Agents are activated in
# groups ("activation events"): the start list, a transition's fixed list, the targets of one
# route label, or for a choices[...] router the union over any non-empty subset of labels.
# A transition fires once none of its consumed agents is pending, so the outputs of one event
# are consumed together: the possible sizes are |event ∩ consume| over all events (non-zero).


def _activation_events(w: Workflow) -> list[frozenset[str]]:
    events = [frozenset(w.start)]
    for t in w.transitions:
        act = t.activate
        if isinstance(act, ActivateAgents):
            events.append(frozenset(act.agents))
        elif isinstance(act, ActivateRoute):
            groups = [frozenset(targets) - {END} for _, targets in act.cases]
            multi = _is_multi(w, act)
            if multi and len(groups) <= MAX_ROUTE_SUBSETS:
                for k in range(1, min(len(groups), _max_picks(w, act)) + 1):
                    for combo in combinations(groups, k):
                        events.append(frozenset().union(*combo))
            elif multi:
                events.append(frozenset().union(*groups))
                events.extend(groups)
            else:
                events.extend(groups)
    return events


def _route_type(w: Workflow, act: ActivateRoute):
    """The type a route reads: an agent's output, a tool's result (``-> Literal[...]``) or a task
    field, then its record fields."""
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


def _max_picks(w: Workflow, act: ActivateRoute) -> int:
    """How many labels one firing of a ``choices`` router can pick: every label, except for an
    agent read by ``std.digit_choices`` whose ``allow`` list holds single digits only -- each
    generated token is then one index digit, so ``max_tokens`` digits pick at most that many
    labels (``max_tokens: 1`` makes it a one-label router)."""
    agent = {a.name: a for a in w.agents}.get(act.on.path[0])
    if agent is None or len(act.on.path) > 1 or (agent.extractor.module, agent.extractor.function) != (
            "srpo_graph.std", "digit_choices"):
        return len(act.cases)
    allow = agent.sampling.allow
    if not allow or not all(len(x) == 1 and x.isdigit() for x in allow):
        return len(act.cases)
    return max(1, min(len(act.cases), agent.sampling.max_tokens))


def _is_multi(w: Workflow, act: ActivateRoute) -> bool:
    t = _route_type(w, act)
    return isinstance(t, ChoiceType) and t.multi


def _check_availability(w: Workflow, trans: list[Transition], events, sink: DiagnosticSink, uses) -> None:
    """Forward must-analysis: the names certainly produced before each node runs."""
    tools = {tc.name for t in trans for tc in t.tools}
    top = frozenset({a.name for a in w.agents} | tools)
    by_agent_sources: dict[str, list[str | None]] = {a.name: [] for a in w.agents}
    for a in w.start:
        by_agent_sources.setdefault(a, []).append(None)
    for t in trans:
        act = t.activate
        targets = act.agents if isinstance(act, ActivateAgents) else (
            [x for _, ts in act.cases for x in ts] if isinstance(act, ActivateRoute) else [])
        for a in targets:
            if a != END:
                by_agent_sources.setdefault(a, []).append(t.name)
    full = {t.name: min(t.set_sizes) == len(t.consume) for t in trans}
    a_in = {a: top for a in by_agent_sources}
    t_out = {t.name: top for t in trans}
    t_in = {t.name: top for t in trans}
    # Every update intersects with the previous value, so each set only shrinks: the loop ends
    # after at most |nodes| x |names| rounds even on a malformed graph (two transitions with one
    # name used to make it oscillate forever). The cap below is a second, explicit bound.
    changed = True
    rounds = 0
    limit = (len(by_agent_sources) + len(trans) + 1) * (len(top) + 1) + 1
    while changed and rounds < limit:
        changed, rounds = False, rounds + 1
        for a, sources in by_agent_sources.items():
            if not sources:
                continue
            new = frozenset.intersection(*[frozenset() if s is None else t_out[s] for s in sources]) & a_in[a]
            if new != a_in[a]:
                a_in[a], changed = new, True
        for t in trans:
            outs = [a_in.get(c, top) | {c} for c in t.consume]
            if not outs:
                continue
            new_in = (frozenset.union(*outs) if full[t.name] else frozenset.intersection(*outs)) & t_in[t.name]
            new_out = (new_in | {tc.name for tc in t.tools}) & t_out[t.name]
            if new_in != t_in[t.name] or new_out != t_out[t.name]:
                t_in[t.name], t_out[t.name], changed = new_in, new_out, True

    def need(ref, have, where: str) -> None:
        head = ref.path[0]
        if ref.optional or head == "task" or head not in top or head in have:
            return
        sink.error(f"'{ref}' is not produced on every path before {where}", ref.span,
                   f"make sure '{head}' always runs first, or write {{{ref}?}} to read it only when present",
                   "not-produced")

    for a, refs in uses.agent_refs.items():
        for r in refs:
            need(r, a_in.get(a, top), f"agent '{a}' runs")
    for t in trans:
        names = [tc.name for tc in t.tools]
        for k, r in uses.tool_refs.get(t.name, []):
            need(r, t_in[t.name] | set(names[:k]), f"tool '{names[k] if k < len(names) else '?'}' runs")
        for r in uses.reward_refs.get(t.name, []):
            need(r, t_out[t.name], f"transition '{t.name}' gives its reward")
        if t.name in uses.route_refs:
            # its own tools run before it routes (a route on a tool's `-> Literal[...]` result)
            need(uses.route_refs[t.name], t_out[t.name], f"transition '{t.name}' routes")
    enders = [t.name for t in trans if isinstance(t.activate, ActivateEnd) or (
        isinstance(t.activate, ActivateRoute) and (any(END in ts for _, ts in t.activate.cases)
                                                   or len(t.activate.cases) < _num_options(w, t.activate)))]
    at_end = frozenset.intersection(*[t_out[n] for n in enders]) if enders else top
    # the terminal reward runs when the episode finishes, i.e. once nothing is pending and every
    # fresh output was consumed, not when the first `end` is activated: whatever every complete
    # episode produces is there too (a start agent joined with a later one, Note [Produced at end])
    at_end = at_end | _produced_by_every_episode(w, trans)
    for r in uses.terminal_refs:
        need(r, at_end, "the episode ends")


def _produced_by_every_episode(w: Workflow, trans: list[Transition]) -> frozenset[str]:
    """Agents and tool results every episode that finishes ``ok`` has produced (a least fixpoint).

    Note [Produced at end]
        A start agent is produced. An ``ok`` episode only finishes when no output is left
        unconsumed, so a transition consuming a surely produced agent surely fires; its tools
        then surely run, and the agents it activates unconditionally (a fixed list, or the
        agents every route case names when every label has a case) are surely produced.
    """
    sure = set(w.start)
    fired: set[str] = set()
    changed = True
    while changed:
        changed = False
        for t in trans:
            if t.name in fired or not any(c in sure for c in t.consume):
                continue
            fired.add(t.name)
            changed = True
            sure |= {tc.name for tc in t.tools}
            act = t.activate
            if isinstance(act, ActivateAgents):
                sure |= set(act.agents) - {END}
            elif isinstance(act, ActivateRoute) and act.cases and len(act.cases) >= _num_options(w, act):
                sure |= set.intersection(*[set(ts) for _, ts in act.cases]) - {END}
    return frozenset(sure)


def _num_options(w: Workflow, act: ActivateRoute) -> int:
    t = _route_type(w, act)
    return len(t.options) if isinstance(t, ChoiceType) else 0


def _firing_bound(g: nx.MultiDiGraph, w: Workflow) -> tuple[int, str]:
    """An upper bound on transition firings per episode, and why.

    Two sound bounds on an acyclic graph; the smaller wins. ``paths``: how often each node can
    run, over all branches at once (a transition whose sets are always full fires once per
    wave of its consumed agents, max; one with variable sets may fire once per agent, sum).
    ``down``: firings downstream of a node when a single-choice router takes one case only
    (max over cases); a join is counted once per consumed agent, which over-counts and so stays
    an upper bound.
    """
    simple = nx.DiGraph(g)
    if not nx.is_directed_acyclic_graph(simple):
        return w.max_steps, "max_steps; the graph has bounded cycles"
    full = {t.name: min(t.set_sizes, default=0) == len(t.consume) for t in w.transitions}
    paths = {n: 0 for n in simple}
    paths["start"] = 1
    for n in nx.topological_sort(simple):
        preds = [paths[p] for p in simple.predecessors(n)]
        if n != "start" and preds:
            if n in full and not full[n]:  # once per activation event of its agents: per source, not per agent
                sources = {s for a in simple.predecessors(n) for s in simple.predecessors(a)}
                paths[n] = sum(paths[s] for s in sources)
            else:
                paths[n] = max(preds) if full.get(n) else sum(preds)
    every_branch = sum(paths[t.name] for t in w.transitions)
    consumer = {a: t.name for t in w.transitions for a in t.consume}
    by_name = {t.name: t for t in w.transitions}
    down: dict[str, int] = {}
    for n in reversed(list(nx.topological_sort(simple))):
        if n in by_name:
            act = by_name[n].activate
            if isinstance(act, ActivateRoute) and not _is_multi(w, act):
                later = max((sum(down.get(a, 0) for a in ts) for _, ts in act.cases), default=0)
            else:
                later = sum(down.get(a, 0) for a in simple.successors(n))
            down[n] = 1 + later
        elif n in consumer:
            down[n] = down.get(consumer[n], 0)
    total = min(every_branch, sum(down.get(a, 0) for a in w.start))
    if total <= w.max_steps:
        return total, "the graph is acyclic"
    return w.max_steps, "max_steps"


def _names(ns: list[str], limit: int = 5) -> str:
    return ", ".join(ns[:limit]) + (f" and {len(ns) - limit} more" if len(ns) > limit else "")


def _why_unreachable(g: nx.MultiDiGraph, n: str, kind: str) -> str:
    """Why nothing runs ``n``: the (themselves unreachable) nodes that would."""
    preds = list(dict.fromkeys(g.predecessors(n)))
    if kind == "agent":
        return (f"only unreachable transitions activate it ({_names(preds)})" if preds
                else "no transition activates it and `start:` does not list it")
    return f"the agents it consumes never run ({_names(preds)})" if preds else "it consumes no agent"


def _why_no_end(g: nx.MultiDiGraph, n: str) -> str:
    """Why ``n`` never finishes: where its paths lead instead."""
    order = {m: i for i, m in enumerate(g.nodes)}
    after = sorted(nx.descendants(g, n) - {n}, key=order.__getitem__)
    return f"its paths only lead to {_names(after)}" if after else "nothing follows it"
