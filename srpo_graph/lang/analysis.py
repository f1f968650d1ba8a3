"""Graph rules and static facts of a checked workflow.

Stage: lang (check). Consumes the draft :class:`~srpo_graph.workflow.Workflow` the checker
built (names and types already resolved) and reports, into the checker's diagnostics:

* every agent output is consumed by exactly one transition (``unconsumed: allow`` makes a
  missing consumer a warning);
* every node is reachable from ``start`` and can reach ``end``;
* every cycle passes through a transition with ``max_rounds`` (reported as a path);
* every unmarked reference (``{x}``, call arguments, route subjects) is produced on every
  run before it is read (one rule for every reader, from :mod:`.explore`, which runs the
  runtime's own firing rule over every route choice).

It also proves each transition's possible active-set sizes and a bound on transition firings
per episode (see Note [Set sizes]).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from srpo_graph.errors import DiagnosticSink, Span
from srpo_graph.lang.explore import MAX_ROUTE_SUBSETS, MAX_STATES, Exploration, explore, subject_type
from srpo_graph.workflow import END, ActivateRoute, ChoiceType, Transition, Workflow


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
                             f"its outputs get no credit; consume it in a transition (`consume: {a}`) to train it",
                             code="unconsumed")
            else:
                sink.error(f"the output of agent '{a}' is not consumed by any transition", span_of(a),
                           "consume it in a transition (`consume: " + a + "`), or write `unconsumed: allow` in the"
                           " agent: an output nobody consumes gets no credit", "unconsumed")
        for extra in ts[1:]:
            sink.error(f"agent '{a}' is consumed by two transitions ('{ts[0]}' and '{extra}')",
                       uses.consume_spans.get((extra, a), span_of(extra)),
                       "an output belongs to exactly one active set: consume it in one transition", "double-consume",
                       related=tuple((sp, f"'{a}' consumed by '{ts[0]}' here")
                                     for sp in [uses.consume_spans.get((ts[0], a))] if sp is not None))

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

    # -- set sizes, superseded outputs and the data-flow of references ------------------------
    # one exploration of the runtime's own firing rule (explore.py) proves all three
    ex = explore(draft) if not uses.incomplete else Exploration(complete=False)
    with_sizes = []
    for t in draft.transitions:
        sizes = set(ex.set_sizes.get(t.name, ()))
        if not ex.complete:  # partial facts: every size a firing could have stays possible
            sizes |= set(range(1, len(t.consume) + 1))
        with_sizes.append(t.model_copy(update={"set_sizes": tuple(sorted(sizes)) or (len(t.consume),)}))
    if not uses.incomplete and not ex.complete:
        sink.warning(f"the set sizes and the data-flow of references are not proven: the runs of this workflow have "
                     f"more than {MAX_STATES} states (or a router with more than {MAX_ROUTE_SUBSETS} labels); "
                     "every set size up to the consumed agents is assumed", draft.span,
                     "lower `max_rounds` / `max_steps`, or use fewer router labels, to have them proven",
                     code="analysis-bounded")
    for (by, a), _ in ex.superseded.items():
        consumer = consumers.get(a) or ["its consumer"]
        sink.warning(f"transition '{by}' can activate agent '{a}' again before '{consumer[0]}' consumed its previous "
                     f"output: that output is superseded (no credit) and '{consumer[0]}' takes the latest one",
                     span_of(by), f"to credit every output of '{a}', let '{consumer[0]}' fire first (declare it "
                     f"before '{by}': of two ready transitions the first declared fires) or activate '{a}' "
                     "once per round", code="superseded")
    if ex.complete:
        _check_availability(draft, ex, sink, uses)
    bound, reason = _firing_bound(g, draft.model_copy(update={"transitions": tuple(with_sizes)}))
    return Analysis(with_sizes, bound, reason)


# Note [Set sizes]
# An active set is the fresh outputs a transition takes when it fires: one per consumed agent
# that has one (Note [Firing semantics] in firing.py). explore.py runs that rule over every
# route choice and records the size of each firing, so the sizes `check` reports are exactly
# the sizes the runtime can produce (tests/lang/test_firing_property.py runs random workflows
# and checks every fired set against them).


def _check_availability(w: Workflow, ex: Exploration, sink: DiagnosticSink, uses) -> None:
    """Every unmarked reference is produced on every run before it is read: one least-fixpoint
    rule (the exploration's meet over all runs) for templates, extractor arguments, tools,
    transition rewards, route subjects and the terminal reward."""
    tools = {tc.name for t in w.transitions for tc in t.tools}
    top = frozenset({a.name for a in w.agents} | tools)

    def need(ref, have, where: str) -> None:
        head = ref.path[0]
        if ref.optional or head == "task" or head not in top or head in have:
            return
        sink.error(f"'{ref}' is not produced on every path before {where}", ref.span,
                   f"make sure '{head}' always runs first, or write {{{ref}?}} to read it only when present",
                   "not-produced")

    for a, refs in uses.agent_refs.items():
        for r in refs:
            need(r, ex.before_agent.get(a, top), f"agent '{a}' runs")
    for t in w.transitions:
        names = [tc.name for tc in t.tools]
        at = ex.at_firing.get(t.name, top)
        for k, r in uses.tool_refs.get(t.name, []):
            need(r, at | set(names[:k]), f"tool '{names[k] if k < len(names) else '?'}' runs")
        for r in uses.reward_refs.get(t.name, []):
            need(r, at | set(names), f"transition '{t.name}' gives its reward")
        if t.name in uses.route_refs:
            need(uses.route_refs[t.name], at | set(names), f"transition '{t.name}' routes")
    at_end = ex.at_end if ex.at_end is not None else top
    for r in uses.terminal_refs:
        need(r, at_end, "the episode ends")


def _is_multi(w: Workflow, act: ActivateRoute) -> bool:
    t = subject_type(w, act)
    return isinstance(t, ChoiceType) and t.multi


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
