"""One episode drawn on its workflow's routing graph, as an SVG element.

Runtime stage. Consumes a :class:`~srpo_graph.workflow.Workflow` and an
:class:`~srpo_graph.runtime.trace.Episode`; produces SVG text, drawn by the one routing-graph
renderer (:func:`srpo_graph.viz.render.to_svg`, the picture of ``srpo-graph viz``) with the
episode's :class:`~srpo_graph.viz.render.Usage` over it. What the episode did is drawn in
colour, what it did not do in grey:

* an agent that produced outputs: in its policy's colour, with ``×N`` (its outputs) and its last value;
* a transition that fired: dark, with ``×N`` (its firings) and the sum of its rewards;
* an arc the episode used: black and thick -- ``start`` arcs, a consume arc when the
  transition consumed an output of that agent, an activate/route arc when a firing activated
  that target (route arcs keep their choice label).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

from srpo_graph.runtime.trace import Episode, TransitionRecord
from srpo_graph.viz.render import Usage, to_svg
from srpo_graph.workflow import ActivateRoute, Workflow


def used_parts(workflow: Workflow, ep: Episode) -> tuple[Counter, Counter, set[tuple[str, str]]]:
    """(outputs per agent, firings per transition, used arcs as (from, to) node pairs).

    >>> from srpo_graph.lang import parse, check
    >>> from srpo_graph.runtime.trace import Output, TransitionRecord, WorkflowRef
    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                 ' transition t { consume: a activate: end } start: a'))
    >>> o = Output(id="o0", agent="a", policy="p", step=0, prompt_ids=[1], completion_ids=[2], logprobs=[-1.0],
    ...            text="z")
    >>> r = TransitionRecord(id="t0", name="t", step=0, consumed=["o0"], activated=["end"])
    >>> ep = Episode(workflow=WorkflowRef(name="w", hash="h"), task_id="x", group_id="g", sample=0, seed=0,
    ...              outputs=[o], transitions=[r], reward=0.0, status="ok")
    >>> agents, fired, arcs = used_parts(w, ep)
    >>> dict(agents), dict(fired), sorted(arcs)
    ({'a': 1}, {'t': 1}, [('a', 't'), ('start', 'a'), ('t', 'end')])
    """
    agent_of = {o.id: o.agent for o in ep.outputs}
    agents = Counter(o.agent for o in ep.outputs)
    fired = Counter(t.name for t in ep.transitions)
    arcs = {("start", a) for a in workflow.start}
    for rec in ep.transitions:
        arcs |= {(agent_of[c], rec.name) for c in rec.consumed if c in agent_of}
        arcs |= {(rec.name, a) for a in rec.activated}
    return agents, fired, arcs


def route_labels(workflow: Workflow, ep: Episode, rec: TransitionRecord) -> list[str] | None:
    """The label(s) a router's firing ``rec`` routed on, read back from the trace: the value of
    the route's subject -- the consumed output of that agent, or that tool's result (``fields``
    of a record followed) -- as a list (one label for ``choice``, the subset for ``choices``).
    None when ``rec``'s transition is not a router or the subject is not in the trace (a task
    field); ``[]`` for a missing value (the route then activated `end`).

    >>> from srpo_graph.lang import parse, check
    >>> from srpo_graph.runtime.trace import Output, WorkflowRef
    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" '
    ...                 'output: choice[a, end] } transition t { consume: a activate: route a max_rounds: 2 } '
    ...                 'start: a'))
    >>> o = Output(id="o0", agent="a", policy="p", step=0, prompt_ids=[1], completion_ids=[2], logprobs=[-1.0],
    ...            text="end", value="end")
    >>> r = TransitionRecord(id="t0", name="t", step=0, consumed=["o0"], activated=["end"])
    >>> ep = Episode(workflow=WorkflowRef(name="w", hash="h"), task_id="x", group_id="g", sample=0, seed=0,
    ...              outputs=[o], transitions=[r], reward=0.0, status="ok")
    >>> route_labels(w, ep, r)
    ['end']
    """
    t = workflow.transition_by_name.get(rec.name)
    if t is None or not isinstance(t.activate, ActivateRoute):
        return None
    head, *fields = t.activate.on.path
    by_id = {o.id: o for o in ep.outputs}
    value: Any
    consumed = [by_id[c] for c in rec.consumed if c in by_id and by_id[c].agent == head]
    if consumed:
        value = consumed[-1].value
    elif rec.tool_results is not None and head in rec.tool_results:
        value = rec.tool_results[head]
    elif head in workflow.agent_by_name:  # an agent's value from an earlier firing: its last output so far
        before = [o for o in ep.outputs if o.agent == head and o.step <= rec.step]
        if not before:
            return None
        value = before[-1].value
    else:
        return None
    for f in fields:
        value = value.get(f) if isinstance(value, dict) else None
    if value is None:
        return []
    labels = value if isinstance(value, list) else [value]
    return [str(v) for v in labels]


def _short(value: Any, limit: int = 18) -> str:
    s = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    s = s.replace("\n", " ")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def usage(workflow: Workflow, ep: Episode) -> Usage:
    """What ``ep`` did, as the renderer's overlay (module docstring)."""
    agents, fired, arcs = used_parts(workflow, ep)
    values = {o.agent: o.value for o in ep.outputs}  # the last value of each agent
    rewards: dict[str, float] = defaultdict(float)
    rewarded = set()
    for rec in ep.transitions:
        rewards[rec.name] += rec.reward or 0.0
        if rec.reward is not None:
            rewarded.add(rec.name)
    return Usage(
        agents=dict(agents),
        fired=dict(fired),
        arcs=frozenset(arcs),
        agent_notes={a: f"×{n} → {_short(values.get(a))}" for a, n in agents.items()},
        transition_notes={t: f"×{n}" + (f"  r={rewards[t]:g}" if t in rewarded else "") for t, n in fired.items()},
        end_note=f"end ({ep.status}, reward {ep.reward:g})",
    )


def episode_svg(workflow: Workflow, ep: Episode) -> str:
    """The routing graph of ``workflow`` with what ``ep`` did highlighted (module docstring).

    Args:
        workflow: the workflow the episode ran (its name must match the trace's).
        ep: one episode.
    Returns:
        An ``<svg>`` element (inline in HTML, or saved as a ``.svg`` file); its nodes and arcs
        have ids ``agent:NAME``, ``transition:NAME`` and ``arc:FROM->TO:K``.
    Raises:
        ValueError: the episode names another workflow.
    """
    if ep.workflow.name != workflow.name:
        raise ValueError(f"the episode ran workflow {ep.workflow.name!r}, not {workflow.name!r}")
    svg = to_svg(workflow, usage(workflow, ep))
    return svg[svg.index("<svg") :]  # the element, without the XML prolog and doctype


__all__ = ["episode_svg", "route_labels", "usage", "used_parts"]
