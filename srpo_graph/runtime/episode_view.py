"""One episode drawn on its workflow's routing graph, as a self-contained SVG.

Runtime stage. Consumes a :class:`~srpo_graph.workflow.Workflow` (node positions from
:func:`srpo_graph.viz.layout.layout`, the same layered layout as ``srpo-graph viz``) and an
:class:`~srpo_graph.runtime.trace.Episode`; produces SVG text. What the episode did is drawn
in colour, what it did not do in grey:

* an agent that produced outputs: filled, with ``×N`` (its outputs) and its last value;
* a transition that fired: filled, with ``×N`` (its firings) and the sum of its rewards;
* an arc the episode used: black and thick -- ``start`` arcs, a consume arc when the
  transition consumed an output of that agent, an activate/route arc when a firing activated
  that target (route arcs keep their choice label).

Plain SVG written here (no matplotlib), so ``srpo-graph show --html`` stays fast.
"""

from __future__ import annotations

import html
import json
from collections import Counter, defaultdict
from typing import Any

from srpo_graph.runtime.trace import Episode
from srpo_graph.viz.layout import layout
from srpo_graph.workflow import END, Workflow

X_GAP, Y_GAP, PAD = 190.0, 96.0, 70.0  # pixels between layer neighbours, between layers; margin
AGENT_W, AGENT_H, BAR_W, BAR_H = 130.0, 42.0, 130.0, 18.0
ON, OFF = "#1f6feb", "#d0d7de"


def used_parts(workflow: Workflow, ep: Episode) -> tuple[Counter, Counter, set[tuple[str, str]]]:
    """(outputs per agent, firings per transition, used arcs as (from, to) node pairs).

    >>> from srpo_graph.lang import parse, check
    >>> from srpo_graph.runtime.trace import Output, TransitionRecord, WorkflowRef
    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                 ' transition t { consume: a activate: end } start: a'))
    >>> o = Output(id="o0", agent="a", policy="p", step=0, prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], text="z")
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


def _short(value: Any, limit: int = 18) -> str:
    s = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    s = s.replace("\n", " ")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _text(x: float, y: float, s: str, *, size: int = 11, color: str = "#111", anchor: str = "middle",
          weight: str = "normal") -> str:
    return (f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' fill='{color}' text-anchor='{anchor}' "
            f"font-weight='{weight}' dominant-baseline='middle'>{html.escape(s)}</text>")


def _arc(p: tuple[float, float], q: tuple[float, float], *, used: bool, dashed: bool, back: bool) -> str:
    (x1, y1), (x2, y2) = p, q
    color, width = ("#111", 2.4) if used else (OFF, 1.2)
    dash = " stroke-dasharray='6 4'" if dashed else ""
    if back or y2 <= y1:  # a cycle closing upwards: bow out to the right
        cx, cy = max(x1, x2) + 0.6 * X_GAP, (y1 + y2) / 2
        d = f"M{x1:.1f},{y1:.1f} Q{cx:.1f},{cy:.1f} {x2:.1f},{y2:.1f}"
    else:
        d = f"M{x1:.1f},{y1:.1f} L{x2:.1f},{y2:.1f}"
    marker = "on" if used else "off"
    return (f"<path d='{d}' fill='none' stroke='{color}' stroke-width='{width}'{dash} "
            f"marker-end='url(#arrow-{marker})'/>")


def episode_svg(workflow: Workflow, ep: Episode) -> str:
    """The routing graph of ``workflow`` with what ``ep`` did highlighted (module docstring).

    Args:
        workflow: the workflow the episode ran (its name must match the trace's).
        ep: one episode.
    Returns:
        An ``<svg>`` element (inline in HTML, or saved as a ``.svg`` file).
    Raises:
        ValueError: the episode names another workflow.
    """
    if ep.workflow.name != workflow.name:
        raise ValueError(f"the episode ran workflow {ep.workflow.name!r}, not {workflow.name!r}")
    lay = layout(workflow)
    xs = [x for x, _ in lay.pos.values()]
    x0 = min(xs)
    pos = {n: (PAD + AGENT_W / 2 + (x - x0) * X_GAP, PAD / 2 + y * Y_GAP) for n, (x, y) in lay.pos.items()}
    width = PAD * 2 + AGENT_W + (max(xs) - x0) * X_GAP + X_GAP * 0.6
    height = PAD + (len(lay.layers) - 1) * Y_GAP
    agents, fired, arcs = used_parts(workflow, ep)
    values = {o.agent: o.value for o in ep.outputs}  # the last value of each agent
    rewards: dict[str, float] = defaultdict(float)
    for rec in ep.transitions:
        rewards[rec.name] += rec.reward or 0.0
    kinds = {a.name: "agent" for a in workflow.agents} | {t.name: "transition" for t in workflow.transitions}
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}' font-family='system-ui,sans-serif'>",
        "<defs>" + "".join(
            f"<marker id='arrow-{k}' viewBox='0 0 10 10' refX='10' refY='5' markerWidth='7' markerHeight='7' "
            f"orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' fill='{c}'/></marker>"
            for k, c in (("on", "#111"), ("off", OFF))) + "</defs>",
    ]

    def anchor(n: str, toward: tuple[float, float]) -> tuple[float, float]:
        x, y = pos[n]
        half = {"agent": AGENT_H / 2, "transition": BAR_H / 2}.get(kinds.get(n, n), 9.0)
        return (x, y + half) if toward[1] > y else (x, y - half)

    for u, v, data in workflow.graph().edges(data=True):
        back = (u, v) in lay.back_edges
        p, q = anchor(u, pos[v]), anchor(v, pos[u])
        if back or pos[v][1] <= pos[u][1]:
            p, q = (pos[u][0] + AGENT_W / 2 * 0.6, pos[u][1]), (pos[v][0] + AGENT_W / 2 * 0.6, pos[v][1])
        used = (u, v) in arcs
        parts.append(_arc(p, q, used=used, dashed=data["kind"] == "route", back=back))
        if data["kind"] == "route":
            mx, my = (p[0] + q[0]) / 2, (p[1] + q[1]) / 2
            parts.append(_text(mx + 6, my, data.get("label", ""), size=10, color="#c0392b" if used else "#999",
                               anchor="start"))
    for n, (x, y) in pos.items():
        kind = kinds.get(n, n)
        if kind == "agent":
            on = agents[n] > 0
            parts.append(f"<rect x='{x - AGENT_W / 2:.1f}' y='{y - AGENT_H / 2:.1f}' width='{AGENT_W}' "
                         f"height='{AGENT_H}' rx='12' fill='{ON if on else '#f6f8fa'}' stroke='{'#0b3d91' if on else OFF}'"
                         f" stroke-width='1.5'><title>{html.escape(n)}</title></rect>")
            color = "white" if on else "#888"
            label = f"{n}  ×{agents[n]}" if on else n
            parts.append(_text(x, y - 8, label, color=color, weight="bold"))
            parts.append(_text(x, y + 10, f"→ {_short(values.get(n))}" if on else "not run", size=10, color=color))
        elif kind == "transition":
            on = fired[n] > 0
            parts.append(f"<rect x='{x - BAR_W / 2:.1f}' y='{y - BAR_H / 2:.1f}' width='{BAR_W}' height='{BAR_H}' "
                         f"fill='{'#333' if on else '#eee'}' stroke='{'#111' if on else OFF}'/>")
            parts.append(_text(x, y, n, size=10, color="white" if on else "#999"))
            if on:
                note = f"×{fired[n]}" + (f"  r={rewards[n]:g}" if any(
                    r.reward is not None for r in ep.transitions if r.name == n) else "")
                parts.append(_text(x + BAR_W / 2 + 6, y, note, size=10, color="#333", anchor="start"))
        elif n == "start":
            parts.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='7' fill='#111'/>")
            parts.append(_text(x + 12, y, "start", size=10, anchor="start"))
        else:
            on = any(END in r.activated for r in ep.transitions)
            parts.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='9' fill='white' stroke='{'#111' if on else OFF}' "
                         f"stroke-width='2'/><circle cx='{x:.1f}' cy='{y:.1f}' r='5' fill='{'#111' if on else OFF}'/>")
            parts.append(_text(x + 14, y, f"end ({ep.status}, reward {ep.reward:g})", size=10, anchor="start"))
    parts.append("</svg>")
    return "\n".join(parts)


__all__ = ["episode_svg", "used_parts"]
